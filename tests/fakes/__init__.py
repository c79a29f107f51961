"""The local stand-ins the tests talk to: a Slack-API-compatible server, a recording bot, a faulty bot,
signed requests, data builders."""

"""msmon bot: the service a team runs once for all its training jobs (see the bot issue)."""

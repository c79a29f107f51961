"""Small helpers the job and the bot share."""

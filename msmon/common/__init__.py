"""Small helpers the job and the bot share: safe file names from job data (`safenames`), the bot URL check
(`urls`), the Retry-After reader (`retry`). The stdlib only; nothing else of msmon."""

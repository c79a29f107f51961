"""The web console: `msmon serve`'s pages at /console on the bot's own port (routes.py), behind an
operator's login (session.py): the runs, each run's live curves per rank with its alerts marked, the
alert list with acknowledge and silence, and a command box that goes through the same command service
as chat. Server-rendered HTML (pages.py, every piece of job data escaped) from the bot's own state
(views.py), uPlot (MIT, vendored in static/) for the curves, Server-Sent Events for live updates."""

from bot.web.routes import Console, add_console_routes, announce_console, console_link

__all__ = ["Console", "add_console_routes", "announce_console", "console_link"]

"""`msmon demo`: a replayed incident and a real MindSpore job, handled from chat."""

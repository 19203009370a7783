"""The mechanism core: pure numpy and the standard library.

Nothing here imports typer, rich or polars, reads environment variables or
touches files: it turns small aggregated arrays and a keyed random stream into
releases and privacy events.
"""

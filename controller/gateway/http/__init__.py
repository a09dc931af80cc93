"""The HTTP server: client connections, aiohttp's internals and logs, error bodies, paths."""

"""The HTTP server: client connections, requests and answers, fixed routes, what libraries
may log, error bodies, paths; the requests' client to the engines."""

"""Routing and balancing: which engine a request goes to, and when it may go."""

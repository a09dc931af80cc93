"""The front door (OpenAI-compatible routing, on-demand activation): its own issue fills it.

It sits beside the daemon, above the pass: it may import the pass and below.
"""

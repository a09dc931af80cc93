"""The Deployment manifest as values (pure): specs, their errors for people, sources,
names, sizes and durations, listen addresses."""

"""The node's devices as values (pure): the inventory, capacity limits, placement, whom to
preempt."""

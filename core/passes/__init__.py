"""The passes: aging, placement, preemption planning and the preemption saga, each applying the rules to the queue."""

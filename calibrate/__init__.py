"""calibrate: measure real selective-batched iterations, fit the cost model, and check it by replay."""

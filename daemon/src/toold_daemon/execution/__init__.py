"""What runs a batch: the executor (calls in order, journaled, undoable), the batch and
its results, and the runner seam the executor runs tools through (``isolation`` holds
the confined one)."""

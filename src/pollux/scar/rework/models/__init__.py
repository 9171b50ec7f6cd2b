"""Models of the rework-cost experiments: pure numpy, every array with a leading trial axis."""

"""The stand-in's cupyx.scipy (see tests/standin/cupy)."""

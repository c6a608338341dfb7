"""The rules: each seed rule of the decision model in a module named after it, a pure function giving its verdict and its reason."""

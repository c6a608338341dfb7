"""The rules: each rule of the decision model in a module named after it, a pure function
giving its verdict and its reason ("" when it allows, else the rule's name), and the
sentence an explanation gives for it. The decision and the explanation call the same ones.
"""

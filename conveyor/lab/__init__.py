"""The control lab: simulations behind the scale-down and placement defaults.

Needs the ``lab`` extra (NumPy, Matplotlib); nothing here is imported by
``import conveyor``, and Matplotlib is imported only when a plot is asked for.
"""

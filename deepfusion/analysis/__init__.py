"""What a trained generator is worth: inference over many instances and its error against the
reference and the floor, the run's evaluation report, where the error lives, the comparison with
the cheapest classical solve of equal accuracy, and many-query statistics.

May import: :mod:`deepfusion.files`, :mod:`deepfusion.configuration`, :mod:`deepfusion.training`
(the step helpers, the trained model of a run directory) and diffnet; never the commands.
"""

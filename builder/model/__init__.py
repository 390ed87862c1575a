"""The pure model: the matrix, its compatibility rules, the CI plan and the paths every step shares.

Nothing here runs Docker, a subprocess or the network.
"""

"""The pure model: the matrix, its compatibility rules, the CI plan, the paths every step shares, image
references, how far a tag is proven, and the attestation documents.

Nothing here runs Docker, a subprocess or the network.
"""

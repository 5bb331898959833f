"""Retrieval: exact nearest-neighbour search and the kNN-LM datastore."""

from keras_tfam.retrieval.datastore import Datastore
from keras_tfam.retrieval.nearest_neighbors import nearest_neighbors

__all__ = ["Datastore", "nearest_neighbors"]

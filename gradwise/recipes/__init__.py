"""Named optimizers, each a short chain of transforms."""
from gradwise.recipes.adam import Adam, AdamW
from gradwise.recipes.lion import Lion
from gradwise.recipes.muon import Muon
from gradwise.recipes.nadamw import NAdamW
from gradwise.recipes.sgd import SGD
from gradwise.recipes.shampoo import Shampoo

__all__ = ["SGD", "Adam", "AdamW", "Lion", "Muon", "NAdamW", "Shampoo"]

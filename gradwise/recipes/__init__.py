"""Named optimizers, each a short chain of transforms."""
import inspect

from gradwise.recipes.adafactor import Adafactor
from gradwise.recipes.adam import Adam, AdamW
from gradwise.recipes.adam_mini import AdamMini
from gradwise.recipes.adamc import AdamC
from gradwise.recipes.ademamix import AdEMAMix
from gradwise.recipes.adopt import ADOPT
from gradwise.recipes.apollo import APOLLO, APOLLOMini
from gradwise.recipes.came import CAME
from gradwise.recipes.frugal import FRUGAL
from gradwise.recipes.galore import GaLoreAdamW
from gradwise.recipes.kl_shampoo import KLSOAP, KLShampoo
from gradwise.recipes.lion import Lion
from gradwise.recipes.lomo import LOMO, AdaLomo
from gradwise.recipes.lookahead import Lookahead
from gradwise.recipes.mars import MARS
from gradwise.recipes.micro_adam import MicroAdam
from gradwise.recipes.muon import Muon
from gradwise.recipes.nadamw import NAdamW
from gradwise.recipes.normuon import NorMuon
from gradwise.recipes.psgd_kron import PSGDKron
from gradwise.recipes.ranger21 import Ranger21
from gradwise.recipes.schedule_free import ScheduleFreeAdamW, ScheduleFreeSGD, schedule_free
from gradwise.recipes.sgd import SGD
from gradwise.recipes.shampoo import Shampoo
from gradwise.recipes.soap import SOAP
from gradwise.recipes.spam import SPAM
from gradwise.recipes.subset_norm import SubsetNorm

__all__ = ["LOMO", "SGD", "SOAP", "AdaLomo", "Adam", "AdamW",
           "Lion", "Lookahead", "Muon", "NAdamW", "Ranger21", "ScheduleFreeAdamW",
           "ScheduleFreeSGD", "Shampoo", "schedule_free"]
__all__ += ["APOLLO", "APOLLOMini", "CAME", "Adafactor", "AdamMini", "GaLoreAdamW"]
__all__ += ["ADOPT", "MARS", "AdEMAMix"]
__all__ += ["NorMuon"]
__all__ += ["SPAM", "AdamC"]
__all__ += ["FRUGAL", "SubsetNorm"]
__all__ += ["PSGDKron"]
__all__ += ["KLSOAP", "KLShampoo"]
__all__ += ["MicroAdam"]


def takes_state() -> list[str]:
    """The recipes that keep encoded state: their signature offers ``state=`` and they declare no
    ``state_refusal`` (for the errors that refuse it)."""
    kinds = (globals()[name] for name in sorted(__all__))
    return [k.__name__ for k in kinds if isinstance(k, type) and "state" in inspect.signature(k.__init__).parameters
            and not getattr(k, "state_refusal", None)]

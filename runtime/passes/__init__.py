"""Graph passes over the IR; each returns a ``PassResult`` saying whether it changed the graph."""
from .base import Pass, PassManager, PassResult
from .functions import ExpandFunctions, function_body
from .inline_scan import InlineSingleTripScan
from .shape_inference import InferShapes
from .simplify import EliminateDeadNodes, EliminateIdentity, FoldConstants, simplify

__all__ = ["Pass", "PassManager", "PassResult", "ExpandFunctions", "function_body", "InferShapes", "InlineSingleTripScan",
           "EliminateDeadNodes", "EliminateIdentity", "FoldConstants", "simplify"]

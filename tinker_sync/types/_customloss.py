"""Server-side custom loss graphs: the request/reply types of ``create_custom_loss``.

A custom loss is sent as a traced FX-style graph (``CustomLossGraph``: a list of nodes) plus the
named, ranked inputs it reads. tinker_sync's clients run custom losses on the client
(``forward_backward_custom``); these types mirror the official SDK so code that builds or
inspects such requests keeps working.
"""

from typing import Any, Literal, TypeAlias

import attrs

from tinker_sync.types._base import TinkerModel, TinkerRequest, checked

__all__ = [
    "CreateCustomLossRequest",
    "CreateCustomLossResponse",
    "CustomLossGraph",
    "CustomLossInput",
    "CustomLossInputRank",
    "CustomLossNode",
    "CustomLossNodeOp",
]

CustomLossInputRank: TypeAlias = Literal[0, 1, 2]
"""Rank of a custom loss input: per batch (0), per datum (1) or per token (2)."""

CustomLossNodeOp: TypeAlias = Literal[
    "placeholder", "get_attr", "call_function", "call_method", "call_module", "output"
]


@attrs.frozen(kw_only=True, field_transformer=checked)
class CustomLossInput(TinkerRequest):
    """One named input of a custom loss: ``CustomLossInput(name="advantages", rank=1)``.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    name: str
    rank: CustomLossInputRank


@attrs.frozen(kw_only=True, field_transformer=checked)
class CustomLossNode(TinkerRequest):
    """One node of a traced loss graph (op, name, target and its arguments).

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    op: CustomLossNodeOp
    name: str
    target: str
    args: list[Any] = attrs.field(factory=list)
    kwargs: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True, field_transformer=checked)
class CustomLossGraph(TinkerRequest):
    """A traced loss graph: ``CustomLossGraph(nodes=[...])`` (graph format 1).

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    format: Literal[1] = 1
    nodes: list[CustomLossNode]


@attrs.frozen(kw_only=True, field_transformer=checked)
class CreateCustomLossRequest(TinkerRequest):
    """Register a custom loss graph for a session.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    session_id: str
    custom_loss_seq_id: int
    name: str
    inputs: list[CustomLossInput]
    graph: CustomLossGraph
    type: Literal["create_custom_loss"] = "create_custom_loss"


@attrs.frozen(kw_only=True, field_transformer=checked)
class CreateCustomLossResponse(TinkerModel):
    """Reply to ``CreateCustomLossRequest``: the id of the registered loss.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    loss_id: str
    type: Literal["create_custom_loss"] = "create_custom_loss"

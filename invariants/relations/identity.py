"""Which objects a call is about: optimizer ids, and module types a rule may name.

Rules speak of objects, not of API names alone.  Producers give every call its
receiver's stable id (``obj``: ``opt<i>`` for an optimizer, ``m<i>`` for a root
model) and say which optimizers a ``Module.zero_grad`` clears (``clears``: the
optimizers all of whose parameters the module holds).  So "gradients were cleared
before the step" holds for optimizer ``opt1`` only by a clear of *opt1's* gradients,
whichever of the equivalent operations did it.  Calls without ids (traces of older
producers) are about no particular optimizer and match every one, as before.

Module types (``mtype``) are class names.  A torch.nn class name means the same
layer in every program; a user's class name (``Net``, ``Encoder``) means whatever
that program wrote, so an inferred rule is never keyed on one.  Containers and
wrappers (``Sequential``, ``DistributedDataParallel``) are torch's classes, but what
their forward does is the user's modules' behaviour, so they are treated like user
classes.  The core imports no torch: the names are listed here and
tests/integration/test_object_identity.py keeps the list equal to the installed torch's.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..events import (AUTOGRAD_BACKWARD, GRAD_CLEAR_API, MODULE_ZERO_GRAD, OPTIMIZER_ID_PREFIX, OPTIMIZER_ZERO_GRAD,
                      TENSOR_BACKWARD)

#: calls that clear gradients of a set of parameters and say which optimizers' (``clears``)
CLEARING_APIS = frozenset({MODULE_ZERO_GRAD, GRAD_CLEAR_API})

#: every torch.nn.Module subclass exported by torch.nn and torch.nn.parallel (torch 2.13)
TORCH_NN_MODULES = frozenset({
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveLogSoftmaxWithLoss",
    "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "AlphaDropout", "AvgPool1d", "AvgPool2d",
    "AvgPool3d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Bilinear", "CELU",
    "CTCLoss", "ChannelShuffle", "CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d",
    "ConstantPad2d", "ConstantPad3d", "Container", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
    "ConvTranspose2d", "ConvTranspose3d", "CosineEmbeddingLoss", "CosineSimilarity", "CrossEntropyLoss",
    "CrossMapLRN2d", "DataParallel", "DistributedDataParallel", "DistributedDataParallelCPU", "Dropout",
    "Dropout1d", "Dropout2d", "Dropout3d", "ELU", "Embedding", "EmbeddingBag", "FeatureAlphaDropout", "Flatten",
    "Fold", "FractionalMaxPool2d", "FractionalMaxPool3d", "GELU", "GLU", "GRU", "GRUCell", "GaussianNLLLoss",
    "GroupNorm", "Hardshrink", "Hardsigmoid", "Hardswish", "Hardtanh", "HingeEmbeddingLoss", "HuberLoss",
    "Identity", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "KLDivLoss", "L1Loss", "LPPool1d",
    "LPPool2d", "LPPool3d", "LSTM", "LSTMCell", "LayerNorm", "LazyBatchNorm1d", "LazyBatchNorm2d",
    "LazyBatchNorm3d", "LazyConv1d", "LazyConv2d", "LazyConv3d", "LazyConvTranspose1d", "LazyConvTranspose2d",
    "LazyConvTranspose3d", "LazyInstanceNorm1d", "LazyInstanceNorm2d", "LazyInstanceNorm3d", "LazyLinear",
    "LeakyReLU", "Linear", "LinearCrossEntropyLoss", "LocalResponseNorm", "LogSigmoid", "LogSoftmax", "MSELoss",
    "MarginRankingLoss", "MaxPool1d", "MaxPool2d", "MaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d",
    "Mish", "Module", "ModuleDict", "ModuleList", "MultiLabelMarginLoss", "MultiLabelSoftMarginLoss",
    "MultiMarginLoss", "MultiheadAttention", "NLLLoss", "NLLLoss2d", "PReLU", "PairwiseDistance",
    "ParameterDict", "ParameterList", "PixelShuffle", "PixelUnshuffle", "PoissonNLLLoss", "RMSNorm", "RNN",
    "RNNBase", "RNNCell", "RNNCellBase", "RReLU", "ReLU", "ReLU6", "ReflectionPad1d", "ReflectionPad2d",
    "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "SELU", "Sequential", "SiLU",
    "Sigmoid", "SmoothL1Loss", "SoftMarginLoss", "Softmax", "Softmax2d", "Softmin", "Softplus", "Softshrink",
    "Softsign", "SyncBatchNorm", "Tanh", "Tanhshrink", "Threshold", "Transformer", "TransformerDecoder",
    "TransformerDecoderLayer", "TransformerEncoder", "TransformerEncoderLayer", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss", "Unflatten", "Unfold", "Upsample", "UpsamplingBilinear2d",
    "UpsamplingNearest2d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d",
})
#: torch classes whose forward runs the user's modules: their behaviour is the user's
USER_DEFINED_BEHAVIOUR = frozenset({
    "Module", "Container", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
    "DataParallel", "DistributedDataParallel", "DistributedDataParallelCPU",
})


def names_torch_behaviour(mtype: Any) -> bool:
    """Whether a module type names a torch layer, whose behaviour is the same in
    every program (so a rule keyed on it can transfer)."""
    return isinstance(mtype, str) and mtype in TORCH_NN_MODULES and mtype not in USER_DEFINED_BEHAVIOUR


def keyed_on_user_class(params: Mapping[str, Any]) -> bool:
    """An invariant scoped to a module type that is not a torch layer: one program's
    class name, which must not key an inferred rule on its own."""
    mtype = params.get("mtype")
    return bool(mtype) and not names_torch_behaviour(mtype)


def optimizers_of(call: Mapping[str, Any]) -> frozenset[str] | None:
    """The optimizers a call is about: its receiver when that is an optimizer, the
    optimizers a ``Module.zero_grad`` clears; None when it names none (any optimizer)."""
    obj = call.get("obj")
    if isinstance(obj, str) and obj.startswith(OPTIMIZER_ID_PREFIX):
        return frozenset((obj,))
    clears = call.get("clears")
    if clears:
        return frozenset(clears)
    return None


def call_facts(call: Mapping[str, Any]) -> list[tuple[str, frozenset[str] | None]]:
    """(API, optimizers) facts one call establishes.  Equivalent operations are one
    fact: a ``Module.zero_grad`` (or a clear by hand, ``grad_clear``) over all of an
    optimizer's parameters is also that optimizer's ``zero_grad``.  One that clears no optimizer's parameters (a loop
    without an optimizer, or part of a model) still clears gradients before a call
    about no optimizer (a backward), never before a given optimizer's step.  A backward
    is a backward whichever API ran it: ``torch.autograd.backward`` (pipeline schedules
    call it for each stage) is the fact ``Tensor.backward``."""
    api = call["api"]
    if api == AUTOGRAD_BACKWARD:
        api = TENSOR_BACKWARD
    facts = [(api, optimizers_of(call))]
    clears = call.get("clears")
    if api in CLEARING_APIS and clears is not None:
        facts.append((OPTIMIZER_ZERO_GRAD, frozenset(clears)))
    return facts


def same_objects(earlier: frozenset[str] | None, later: frozenset[str] | None) -> bool:
    """Whether two facts may be about the same optimizer (None: about any)."""
    return earlier is None or later is None or not earlier.isdisjoint(later)


#: torch layers whose forward may run one fused native kernel instead of their
#: sub-layers (the "fast path" of transformer encoders and attention: only in
#: evaluation mode without gradients, among other conditions)
FAST_PATH_LAYERS = frozenset({"TransformerEncoderLayer", "TransformerEncoder", "MultiheadAttention"})


def may_take_fast_path(call: Mapping[str, Any]) -> bool:
    """Whether a module call may have skipped its sub-layers for a fused kernel: what it
    contains then says nothing about the layer."""
    if call.get("mtype") not in FAST_PATH_LAYERS:
        return False
    ctx = call.get("ctx")
    return call.get("training") is not True and not (isinstance(ctx, dict) and ctx.get("grad") is True)

//! What a tape node remembers of its operation: enough saved tensors to compute the
//! gradients of its inputs, and nothing more.

use std::sync::Arc;

use mirra_tensor::{ConvSaved, DType, Shape, Tensor, UnaryOp, Window};

use crate::LinearMap;

/// A recorded operation. Input shapes come from the input nodes; only what backward needs
/// beyond them is saved here.
#[derive(Debug)]
pub(crate) enum Op {
    /// A leaf: a parameter (with its key) or a constant that requires no gradient.
    Leaf {
        key: Option<usize>,
    },
    Matmul {
        a: Tensor,
        b: Tensor,
    },
    Add,
    Sub,
    Mul {
        a: Tensor,
        b: Tensor,
    },
    Div {
        a: Tensor,
        b: Tensor,
    },
    /// `y` is the output, kept for the ops whose derivative is cheapest from it.
    Unary {
        op: UnaryOp,
        x: Tensor,
        y: Tensor,
    },
    Affine {
        mul: f64,
    },
    Powf {
        x: Tensor,
        exponent: f64,
    },
    Sum {
        axes: Vec<isize>,
        keepdim: bool,
    },
    Mean {
        axes: Vec<isize>,
        keepdim: bool,
        count: usize,
    },
    Max {
        x: Tensor,
        y: Tensor,
        axes: Vec<isize>,
        keepdim: bool,
    },
    Softmax {
        y: Tensor,
        axis: isize,
    },
    LogSoftmax {
        y: Tensor,
        axis: isize,
    },
    Reshape,
    Permute {
        perm: Vec<usize>,
    },
    Narrow {
        axis: usize,
        start: usize,
    },
    BroadcastTo,
    /// Inputs `parts` (node ids, `NONE` for constants) joined along `axis`, each `sizes`
    /// long there.
    Concat {
        axis: usize,
        parts: Vec<usize>,
        sizes: Vec<usize>,
    },
    /// The sum of any number of inputs (`parts`), broadcasting.
    AddN {
        parts: Vec<usize>,
    },
    Gather {
        axis: isize,
        index: Tensor,
    },
    /// Multiplication by a constant mask (dropout), already scaled.
    MaskMul {
        mask: Tensor,
    },
    /// The largest tap of each window; `argmax` holds each output's flat input index.
    MaxPool {
        argmax: Tensor,
    },
    /// The patches of a window over a channels-last input (convolution, pooling).
    Im2Col {
        window: Window,
        channels: usize,
    },
    /// A convolution (boxed: its operands and geometry are large beside the other ops).
    Conv(Box<Conv>),
    /// A caller's linear map (a sum across replicas); the gradient is its adjoint.
    Linear {
        map: Arc<dyn LinearMap>,
    },
    /// A conversion from `from` (mixed precision's casts); the gradient converts back.
    Cast {
        from: DType,
    },
    /// `[Σx, Σx²]` per channel of a channels-last input `x`.
    ChannelMoments {
        x: Tensor,
    },
    /// `x * scale + shift` per channel; `parts` are the three inputs' node ids (`NONE` for
    /// constants).
    ChannelAffine {
        x: Tensor,
        scale: Tensor,
        parts: [usize; 3],
    },
}

/// What a convolution's backward needs: its input `x`, its `kernel`, its `window`, and the
/// what its forward pass kept for the kernel gradient.
#[derive(Debug)]
pub(crate) struct Conv {
    pub x: Tensor,
    pub kernel: Tensor,
    pub window: Window,
    pub saved: ConvSaved,
}

impl Op {
    /// The inputs of an op that takes any number of them (node ids, `NONE` for
    /// constants); empty for the ops of one or two inputs, which [`Node::inputs`] holds.
    pub(crate) fn variadic_inputs(&self) -> &[usize] {
        match self {
            Op::Concat { parts, .. } | Op::AddN { parts } => parts,
            Op::ChannelAffine { parts, .. } => parts,
            _ => &[],
        }
    }
}

/// One recorded operation with its inputs (node ids; `NONE` where absent; an op of any
/// number of inputs keeps them in the op, [`Op::variadic_inputs`]).
#[derive(Debug)]
pub(crate) struct Node {
    pub op: Op,
    pub inputs: [usize; 2],
    pub shape: Shape,
    /// The first (lowest-numbered) node that consumed this one: once backward has passed
    /// it, this node's gradient is final.
    pub first_use: usize,
}

impl Node {
    /// Every input of the node, fixed and variadic, `NONE` skipped.
    pub(crate) fn all_inputs(&self) -> impl Iterator<Item = usize> + '_ {
        self.inputs
            .iter()
            .chain(self.op.variadic_inputs())
            .copied()
            .filter(|&i| i != NONE)
    }
}

/// Marks an absent input or an unused node.
pub(crate) const NONE: usize = usize::MAX;

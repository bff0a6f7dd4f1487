//! The gradient of each operation's inputs from the gradient of its output.

use mirra_tensor::{Tensor, UnaryOp};

use crate::op::{Conv, Node, Op, NONE};
use crate::{AutogradError, Result};

/// A gradient for the tape to add to what it holds for an input: a tensor, or one it adds
/// in place in one pass without making it a tensor of its own.
pub(crate) enum Grad {
    Tensor(Tensor),
    /// `x`'s gradient through its per-channel moments, whose gradient is `g`
    /// ([`Tensor::channel_moments_backward`]): batch norm adds it to the gradient its
    /// affine map already gave `x`.
    ChannelMoments {
        x: Tensor,
        g: Tensor,
    },
}

impl Grad {
    /// `prev` plus this gradient, or this gradient alone.
    pub(crate) fn added_to(self, prev: Option<Tensor>) -> Result<Tensor> {
        Ok(match (self, prev) {
            (Grad::Tensor(g), None) => g,
            (Grad::Tensor(g), Some(prev)) => prev.accumulate(&g)?,
            (Grad::ChannelMoments { x, g }, None) => x.channel_moments_backward(&g)?,
            (Grad::ChannelMoments { x, g }, Some(prev)) => {
                prev.channel_moments_backward_add(&x, &g)?
            }
        })
    }
}

/// Calls `emit(input, grad)` for every input of `node` that needs a gradient.
pub(crate) fn input_grads(
    nodes: &[Node],
    node: &Node,
    g: Tensor,
    emit: &mut dyn FnMut(usize, Grad) -> Result<()>,
) -> Result<()> {
    let [ia, ib] = node.inputs;
    let dims = |i: usize| &nodes[i].shape[..];
    // Emits the gradient of input `i` if it needs one, reduced to that input's shape
    // (undoing any broadcast).
    let mut to = |i: usize, grad: &dyn Fn() -> Result<Tensor>| -> Result<()> {
        if i == NONE {
            return Ok(());
        }
        emit(i, Grad::Tensor(grad()?.sum_to(dims(i))?))
    };
    match &node.op {
        Op::Leaf { .. } => {}
        Op::Matmul { a, b } => {
            to(ia, &|| Ok(g.matmul(&b.t()?)?))?;
            to(ib, &|| Ok(a.t()?.matmul(&g)?))?;
        }
        Op::Add => {
            to(ia, &|| Ok(g.clone()))?;
            to(ib, &|| Ok(g.clone()))?;
        }
        Op::Sub => {
            to(ia, &|| Ok(g.clone()))?;
            to(ib, &|| Ok(g.neg()?))?;
        }
        Op::Mul { a, b } => {
            to(ia, &|| Ok(g.mul(b)?))?;
            to(ib, &|| Ok(g.mul(a)?))?;
        }
        Op::Div { a, b } => {
            to(ia, &|| Ok(g.div(b)?))?;
            to(ib, &|| Ok(g.mul(a)?.div(&b.square()?)?.neg()?))?;
        }
        Op::Unary { op, x, y } => to(ia, &|| unary_grad(*op, &g, x, y))?,
        Op::Affine { mul } => to(ia, &|| Ok(g.scale(*mul)?))?,
        Op::Powf { x, exponent } => to(ia, &|| {
            Ok(g.mul(&x.powf(exponent - 1.0)?.scale(*exponent)?)?)
        })?,
        Op::Sum { axes, keepdim } => to(ia, &|| spread(&g, axes, *keepdim, dims(ia)))?,
        Op::Mean {
            axes,
            keepdim,
            count,
        } => to(ia, &|| {
            spread(&g.scale(1.0 / *count as f64)?, axes, *keepdim, dims(ia))
        })?,
        Op::Max {
            x,
            y,
            axes,
            keepdim,
        } => to(ia, &|| {
            let mask = x.eq_mask(y)?;
            let ties = mask.sum(axes, true)?;
            let g = spread(&g, axes, *keepdim, dims(ia))?;
            Ok(g.mul(&mask)?.div(&ties)?)
        })?,
        Op::Softmax { y, axis } => to(ia, &|| Ok(y.softmax_backward(&g, *axis)?))?,
        Op::LogSoftmax { y, axis } => to(ia, &|| Ok(y.log_softmax_backward(&g, *axis)?))?,
        Op::Reshape => to(ia, &|| Ok(g.reshape(dims(ia))?))?,
        Op::Permute { perm } => to(ia, &|| {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            Ok(g.permute(&inverse)?)
        })?,
        Op::Narrow { axis, start } => to(ia, &|| {
            let full = dims(ia);
            let len = g.dims()[*axis];
            let pad = |n: usize| {
                let mut d = full.to_vec();
                d[*axis] = n;
                Tensor::zeros(&d, g.dtype(), g.device())
            };
            let (before, after) = (pad(*start)?, pad(full[*axis] - start - len)?);
            Ok(Tensor::concat(&[&before, &g, &after], *axis as isize)?)
        })?,
        Op::BroadcastTo => to(ia, &|| Ok(g.clone()))?,
        Op::Concat { axis, parts, sizes } => {
            let mut offset = 0;
            for (&input, &size) in parts.iter().zip(sizes) {
                if input != NONE {
                    emit(input, Grad::Tensor(g.narrow(*axis as isize, offset, size)?))?;
                }
                offset += size;
            }
        }
        Op::AddN { parts } => {
            for &input in parts.iter().filter(|&&i| i != NONE) {
                emit(input, Grad::Tensor(g.sum_to(dims(input))?))?;
            }
        }
        Op::Gather { axis, index } => to(ia, &|| Ok(g.scatter_add(*axis, index, dims(ia))?))?,
        Op::MaskMul { mask } => to(ia, &|| Ok(g.mul(mask)?))?,
        Op::Im2Col { window, channels } => to(ia, &|| Ok(g.col2im(window, *channels)?))?,
        Op::Conv(conv) => {
            let Conv {
                x,
                kernel,
                window,
                saved,
            } = &**conv;
            to(ia, &|| Ok(g.conv_input_grad(kernel, window)?))?;
            to(ib, &|| {
                Ok(x.conv_kernel_grad(&g, window, saved)?
                    .reshape(kernel.dims())?)
            })?;
        }
        Op::Linear { map } => to(ia, &|| {
            map.adjoint(&g)
                .map_err(|message| AutogradError::Map { message })
        })?,
        Op::Cast { from } => to(ia, &|| Ok(g.to_dtype(*from)?))?,
        Op::ChannelMoments { x } => {
            if ia != NONE {
                emit(ia, Grad::ChannelMoments { x: x.clone(), g })?;
            }
        }
        Op::ChannelAffine { x, scale, parts } => {
            let grads = g.channel_affine_backward(x, scale)?;
            for (&input, grad) in parts.iter().zip(grads) {
                if input != NONE {
                    emit(input, Grad::Tensor(grad))?;
                }
            }
        }
        Op::MaxPool { argmax } => to(ia, &|| {
            // Each output's gradient to its winning input element.
            Ok(g.max_pool_grad(argmax, dims(ia))?)
        })?,
    }
    Ok(())
}

/// The gradient of a reduction's input: the output gradient with the reduced axes put
/// back as size 1, broadcast (as a view) over the input's shape.
fn spread(g: &Tensor, axes: &[isize], keepdim: bool, input: &[usize]) -> Result<Tensor> {
    let mut kept = input.to_vec();
    let r = input.len() as isize;
    if axes.is_empty() {
        kept.fill(1);
    }
    for &a in axes {
        kept[(if a < 0 { a + r } else { a }) as usize] = 1;
    }
    let g = if keepdim {
        g.clone()
    } else {
        g.reshape(&kept)?
    };
    Ok(g.broadcast_to(input)?)
}

fn unary_grad(op: UnaryOp, g: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    Ok(match op {
        UnaryOp::Relu => g.relu_backward(x)?,
        UnaryOp::Sigmoid => g.sigmoid_backward(y)?,
        UnaryOp::Tanh => g.tanh_backward(y)?,
        UnaryOp::Gelu => g.gelu_backward(x)?,
        UnaryOp::Exp => g.mul(y)?,
        UnaryOp::Log => g.div(x)?,
        UnaryOp::Sqrt => g.div(y)?.scale(0.5)?,
        UnaryOp::Neg => g.neg()?,
        UnaryOp::Abs => g.mul(&x.sign()?)?,
        UnaryOp::Square => g.mul(x)?.scale(2.0)?,
        UnaryOp::Recip => g.mul(&y.square()?)?.neg()?,
        UnaryOp::Sign => g.zeros_like()?,
    })
}

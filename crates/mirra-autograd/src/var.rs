use std::sync::Arc;

use mirra_tensor::{BinaryOp, DType, Shape, Tensor, UnaryOp, Window};

use crate::op::{Conv, Op, NONE};
use crate::tape::Gradients;
use crate::{AutogradError, LinearMap, Result, Tape};

/// A tensor value on a [`Tape`]. Operations on variables compute their value at once and
/// record themselves when an input needs a gradient.
#[derive(Clone, Debug)]
pub struct Var<'t> {
    tape: &'t Tape,
    id: Option<usize>,
    value: Tensor,
}

impl<'t> Var<'t> {
    pub(crate) fn new(tape: &'t Tape, id: Option<usize>, value: Tensor) -> Var<'t> {
        Var { tape, id, value }
    }

    /// The computed value.
    pub fn value(&self) -> &Tensor {
        &self.value
    }

    /// The value's shape.
    pub fn shape(&self) -> &Shape {
        self.value.shape()
    }

    /// True when a gradient flows back through this variable.
    pub fn requires_grad(&self) -> bool {
        self.id.is_some()
    }

    /// The tape this variable lives on.
    pub fn tape(&self) -> &'t Tape {
        self.tape
    }

    pub(crate) fn id(&self) -> Option<usize> {
        self.id
    }

    /// A result of one input: recorded only if the input needs a gradient.
    fn from1(&self, value: Tensor, op: impl FnOnce() -> Op) -> Var<'t> {
        let id = self
            .id
            .map(|a| self.tape.push(op(), [a, NONE], *value.shape()));
        Var {
            tape: self.tape,
            id,
            value,
        }
    }

    /// A result of two inputs: recorded if either needs a gradient.
    fn from2(&self, other: &Var<'t>, value: Tensor, op: impl FnOnce() -> Op) -> Result<Var<'t>> {
        if !std::ptr::eq(self.tape, other.tape) {
            return Err(AutogradError::ForeignTape { op: "binary op" });
        }
        let id = match (self.id, other.id) {
            (None, None) => None,
            (a, b) => Some(self.tape.push(
                op(),
                [a.unwrap_or(NONE), b.unwrap_or(NONE)],
                *value.shape(),
            )),
        };
        Ok(Var {
            tape: self.tape,
            id,
            value,
        })
    }

    /// Matrix product over the last two dimensions.
    pub fn matmul(&self, rhs: &Var<'t>) -> Result<Var<'t>> {
        let value = self.value.matmul(&rhs.value)?;
        self.from2(rhs, value, || Op::Matmul {
            a: self.value.clone(),
            b: rhs.value.clone(),
        })
    }

    /// `self + rhs`, broadcasting.
    pub fn add(&self, rhs: &Var<'t>) -> Result<Var<'t>> {
        self.from2(rhs, self.value.add(&rhs.value)?, || Op::Add)
    }

    /// `self - rhs`, broadcasting.
    pub fn sub(&self, rhs: &Var<'t>) -> Result<Var<'t>> {
        self.from2(rhs, self.value.sub(&rhs.value)?, || Op::Sub)
    }

    /// `self * rhs`, broadcasting.
    pub fn mul(&self, rhs: &Var<'t>) -> Result<Var<'t>> {
        let value = self.value.mul(&rhs.value)?;
        self.from2(rhs, value, || Op::Mul {
            a: self.value.clone(),
            b: rhs.value.clone(),
        })
    }

    /// `self / rhs`, broadcasting.
    pub fn div(&self, rhs: &Var<'t>) -> Result<Var<'t>> {
        let value = self.value.div(&rhs.value)?;
        self.from2(rhs, value, || Op::Div {
            a: self.value.clone(),
            b: rhs.value.clone(),
        })
    }

    /// Apply an element-wise function.
    pub fn unary(&self, op: UnaryOp) -> Result<Var<'t>> {
        let y = self.value.unary(op)?;
        Ok(self.from1(y.clone(), || Op::Unary {
            op,
            x: self.value.clone(),
            y,
        }))
    }

    /// `max(x, 0)`.
    pub fn relu(&self) -> Result<Var<'t>> {
        self.unary(UnaryOp::Relu)
    }

    /// The logistic sigmoid.
    pub fn sigmoid(&self) -> Result<Var<'t>> {
        self.unary(UnaryOp::Sigmoid)
    }

    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Var<'t>> {
        self.unary(UnaryOp::Tanh)
    }

    /// Exact GELU.
    pub fn gelu(&self) -> Result<Var<'t>> {
        self.unary(UnaryOp::Gelu)
    }

    /// `e^x`.
    pub fn exp(&self) -> Result<Var<'t>> {
        self.unary(UnaryOp::Exp)
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<Var<'t>> {
        self.unary(UnaryOp::Log)
    }

    /// Square root.
    pub fn sqrt(&self) -> Result<Var<'t>> {
        self.unary(UnaryOp::Sqrt)
    }

    /// `-x`.
    pub fn neg(&self) -> Result<Var<'t>> {
        self.unary(UnaryOp::Neg)
    }

    /// `x * x`.
    pub fn square(&self) -> Result<Var<'t>> {
        self.unary(UnaryOp::Square)
    }

    /// `x * mul + add`.
    pub fn affine(&self, mul: f64, add: f64) -> Result<Var<'t>> {
        Ok(self.from1(self.value.affine(mul, add)?, || Op::Affine { mul }))
    }

    /// `x * factor`.
    pub fn scale(&self, factor: f64) -> Result<Var<'t>> {
        self.affine(factor, 0.0)
    }

    /// `x ^ exponent`.
    pub fn powf(&self, exponent: f64) -> Result<Var<'t>> {
        let value = self.value.powf(exponent)?;
        Ok(self.from1(value, || Op::Powf {
            x: self.value.clone(),
            exponent,
        }))
    }

    /// Sum over `axes` (empty: all).
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Var<'t>> {
        let value = self.value.sum(axes, keepdim)?;
        Ok(self.from1(value, || Op::Sum {
            axes: axes.to_vec(),
            keepdim,
        }))
    }

    /// Mean over `axes` (empty: all).
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Var<'t>> {
        let value = self.value.mean(axes, keepdim)?;
        let count = self.value.elem_count() / value.elem_count().max(1);
        Ok(self.from1(value, || Op::Mean {
            axes: axes.to_vec(),
            keepdim,
            count,
        }))
    }

    /// Maximum over `axes` (empty: all). The gradient is shared equally among ties.
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Result<Var<'t>> {
        let y = self.value.max(axes, keepdim)?;
        let y_keep = if keepdim {
            y.clone()
        } else {
            self.value.max(axes, true)?
        };
        Ok(self.from1(y, || Op::Max {
            x: self.value.clone(),
            y: y_keep,
            axes: axes.to_vec(),
            keepdim,
        }))
    }

    /// Softmax along `axis`.
    pub fn softmax(&self, axis: isize) -> Result<Var<'t>> {
        let y = self.value.softmax(axis)?;
        Ok(self.from1(y.clone(), || Op::Softmax { y, axis }))
    }

    /// Log-softmax along `axis`.
    pub fn log_softmax(&self, axis: isize) -> Result<Var<'t>> {
        let y = self.value.log_softmax(axis)?;
        Ok(self.from1(y.clone(), || Op::LogSoftmax { y, axis }))
    }

    /// The same elements with another shape.
    pub fn reshape(&self, dims: &[usize]) -> Result<Var<'t>> {
        Ok(self.from1(self.value.reshape(dims)?, || Op::Reshape))
    }

    /// Swap two dimensions.
    pub fn transpose(&self, a: isize, b: isize) -> Result<Var<'t>> {
        let (ra, rb) = (
            self.shape().axis("transpose", a)?,
            self.shape().axis("transpose", b)?,
        );
        let mut perm: Vec<usize> = (0..self.shape().rank()).collect();
        perm.swap(ra, rb);
        self.permute(&perm)
    }

    /// Reorder dimensions.
    pub fn permute(&self, perm: &[usize]) -> Result<Var<'t>> {
        let value = self.value.permute(perm)?;
        Ok(self.from1(value, || Op::Permute {
            perm: perm.to_vec(),
        }))
    }

    /// `len` entries of `axis` from `start`.
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Var<'t>> {
        let value = self.value.narrow(axis, start, len)?;
        let axis = self.shape().axis("narrow", axis)?;
        Ok(self.from1(value, || Op::Narrow { axis, start }))
    }

    /// Broadcast to `dims`.
    pub fn broadcast_to(&self, dims: &[usize]) -> Result<Var<'t>> {
        Ok(self.from1(self.value.broadcast_to(dims)?, || Op::BroadcastTo))
    }

    /// Values at `index` along `axis` (PyTorch's `gather`).
    pub fn gather(&self, axis: isize, index: &Tensor) -> Result<Var<'t>> {
        let value = self.value.gather(axis, index)?;
        Ok(self.from1(value, || Op::Gather {
            axis,
            index: index.clone(),
        }))
    }

    /// The patches of `window` over this channels-last `[n, d1, .., dk, c]` value ([`Tensor::im2col`]); the
    /// gradient sums them back ([`Tensor::col2im`]).
    pub fn im2col(&self, window: &Window) -> Result<Var<'t>> {
        let value = self.value.im2col(window)?;
        let channels = self.value.dims().last().copied().unwrap_or(0);
        Ok(self.from1(value, || Op::Im2Col {
            window: *window,
            channels,
        }))
    }

    /// The convolution of this channels-last `[n, d1, .., dk, c]` value with `kernel`
    /// (`[k1, .., kk, c, f]`) over `window`, without bias ([`Tensor::conv`]).
    pub fn conv(&self, kernel: &Var<'t>, window: &Window) -> Result<Var<'t>> {
        let (value, saved) = self.value.conv(&kernel.value, window)?;
        self.from2(kernel, value, || {
            Op::Conv(Box::new(Conv {
                x: self.value.clone(),
                kernel: kernel.value.clone(),
                window: *window,
                saved,
            }))
        })
    }

    /// The largest tap of each `window` over this channels-last `[n, d1, .., dk, c]` value, per channel
    /// ([`Tensor::max_pool`]); the gradient goes to each window's winner.
    pub fn max_pool(&self, window: &Window) -> Result<Var<'t>> {
        let (value, argmax) = self.value.max_pool(window)?;
        Ok(self.from1(value, || Op::MaxPool { argmax }))
    }

    /// A caller's linear map of this value (a sum across replicas): the value is
    /// `map.apply(x)`, the gradient `map.adjoint(g)`. A variable that needs no gradient
    /// records nothing, so the adjoint is called exactly when this variable depends on a
    /// parameter.
    pub fn linear_map(&self, map: Arc<dyn LinearMap>) -> Result<Var<'t>> {
        let value = map
            .apply(&self.value)
            .map_err(|message| AutogradError::Map { message })?;
        Ok(self.from1(value, || Op::Linear { map }))
    }

    /// Multiply by a constant tensor (a dropout mask), broadcasting.
    pub fn mask_mul(&self, mask: &Tensor) -> Result<Var<'t>> {
        let value = self.value.binary(BinaryOp::Mul, mask)?;
        Ok(self.from1(value, || Op::MaskMul { mask: mask.clone() }))
    }

    /// Join variables along `axis`.
    pub fn concat(vars: &[&Var<'t>], axis: isize) -> Result<Var<'t>> {
        let first = vars.first().ok_or_else(|| {
            AutogradError::Tensor(mirra_tensor::TensorError::Invalid {
                op: "concat",
                msg: "no variables given".into(),
                shape: Shape::scalar(),
            })
        })?;
        let tape = first.tape;
        if vars.iter().any(|v| !std::ptr::eq(v.tape, tape)) {
            return Err(AutogradError::ForeignTape { op: "concat" });
        }
        let values: Vec<&Tensor> = vars.iter().map(|v| &v.value).collect();
        let value = Tensor::concat(&values, axis)?;
        let ax = first.shape().axis("concat", axis)?;
        let id = if vars.iter().any(|v| v.id.is_some()) {
            let parts = vars.iter().map(|v| v.id.unwrap_or(NONE)).collect();
            let sizes = vars.iter().map(|v| v.shape()[ax]).collect();
            let op = Op::Concat {
                axis: ax,
                parts,
                sizes,
            };
            Some(tape.push(op, [NONE, NONE], *value.shape()))
        } else {
            None
        };
        Ok(Var { tape, id, value })
    }

    /// This variable converted to `dtype` (itself when it has that dtype already); the
    /// gradient is converted back, so a weight kept in f32 and computed with in bf16 gets
    /// an f32 gradient (mixed precision).
    pub fn to_dtype(&self, dtype: DType) -> Result<Var<'t>> {
        let from = self.value.dtype();
        if from == dtype {
            return Ok(self.clone());
        }
        Ok(self.from1(self.value.to_dtype(dtype)?, || Op::Cast { from }))
    }

    /// `[Σx, Σx²]` per channel of this channels-last `[.., c]` variable (`[2c]`): the
    /// statistics of batch normalization in one pass.
    pub fn channel_moments(&self) -> Result<Var<'t>> {
        let value = self.value.channel_moments()?;
        Ok(self.from1(value, || Op::ChannelMoments {
            x: self.value.clone(),
        }))
    }

    /// `self * scale + shift` per channel of this `[.., c]` variable, `scale` and `shift`
    /// of `[c]`: batch normalization's affine map in one pass (and two backward).
    pub fn channel_affine(&self, scale: &Var<'t>, shift: &Var<'t>) -> Result<Var<'t>> {
        let tape = self.tape;
        if !std::ptr::eq(scale.tape, tape) || !std::ptr::eq(shift.tape, tape) {
            return Err(AutogradError::ForeignTape {
                op: "channel_affine",
            });
        }
        let value = self.value.channel_affine(&scale.value, &shift.value)?;
        let parts = [self.id, scale.id, shift.id].map(|id| id.unwrap_or(NONE));
        let id = (parts != [NONE; 3]).then(|| {
            let op = Op::ChannelAffine {
                x: self.value.clone(),
                scale: scale.value.clone(),
                parts,
            };
            tape.push(op, [NONE, NONE], *value.shape())
        });
        Ok(Var { tape, id, value })
    }

    /// The sum of any number of variables, broadcasting (Keras's `Add` layer: a residual
    /// block's skip connection): one node, whose gradient goes to every input.
    pub fn add_n(vars: &[&Var<'t>]) -> Result<Var<'t>> {
        let first = vars.first().ok_or_else(|| {
            AutogradError::Tensor(mirra_tensor::TensorError::Invalid {
                op: "add_n",
                msg: "no variables given".into(),
                shape: Shape::scalar(),
            })
        })?;
        let tape = first.tape;
        if vars.iter().any(|v| !std::ptr::eq(v.tape, tape)) {
            return Err(AutogradError::ForeignTape { op: "add_n" });
        }
        let mut value = first.value.clone();
        for v in &vars[1..] {
            value = value.add(&v.value)?;
        }
        let id = if vars.iter().any(|v| v.id.is_some()) {
            let parts = vars.iter().map(|v| v.id.unwrap_or(NONE)).collect();
            Some(tape.push(Op::AddN { parts }, [NONE, NONE], *value.shape()))
        } else {
            None
        };
        Ok(Var { tape, id, value })
    }
}

/// The tape's entry points that take or make variables (here, so that the tape below
/// knows nothing of them).
impl Tape {
    /// A value that needs no gradient (inputs, labels).
    pub fn constant(&self, value: Tensor) -> Var<'_> {
        Var::new(self, None, value)
    }

    /// A trainable parameter; its gradient is reported under `key`.
    pub fn param(&self, value: Tensor, key: usize) -> Var<'_> {
        let id = self.push(Op::Leaf { key: Some(key) }, [NONE, NONE], *value.shape());
        Var::new(self, Some(id), value)
    }

    /// Gradients of the scalar `loss` with respect to every parameter it depends on.
    pub fn backward(&self, loss: &Var<'_>) -> Result<Gradients> {
        self.backward_with(loss, |_, _| Ok(()))
    }

    /// Like [`Tape::backward`], calling `on_ready(key, grad)` as soon as a parameter's
    /// gradient is final, in reverse order of first use (last layer first). An error from
    /// the callback stops backward and is returned.
    pub fn backward_with<F>(&self, loss: &Var<'_>, mut on_ready: F) -> Result<Gradients>
    where
        F: FnMut(usize, &Tensor) -> std::result::Result<(), String>,
    {
        if !std::ptr::eq(loss.tape(), self) {
            return Err(AutogradError::ForeignTape { op: "backward" });
        }
        if loss.value().elem_count() != 1 {
            return Err(AutogradError::NonScalarLoss {
                shape: *loss.value().shape(),
            });
        }
        let seed = loss.value().full_like(1.0)?;
        self.backward_from(loss.id(), seed, &mut on_ready)
    }
}

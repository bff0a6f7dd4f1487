//! Convolution layers, channels-last as Keras's: `Conv2D`.
//!
//! A convolution is the patches of its window (`im2col`, whose gradient is `col2im`) times
//! the kernel reshaped to a matrix: one matrix product through the gemm path, and every
//! gradient from the ops the tape already has.

use mirra_autograd::Var;
use mirra_tensor::init::Initializer;
use mirra_tensor::{Padding, Window2d};

use crate::{Activation, ForwardCtx, Layer, NnError, ParamSpec, Result};

/// `[h, w, c]` of a layer input without its batch dimension, or the error naming the layer.
pub(crate) fn hwc(layer: &str, input: &[usize]) -> Result<[usize; 3]> {
    match input {
        &[h, w, c] => Ok([h, w, c]),
        other => Err(NnError::Config {
            layer: layer.into(),
            msg: format!(
                "needs inputs [height, width, channels] (channels last), got {other:?} \
                 (add a Reshape layer before it)"
            ),
        }),
    }
}

/// A 2D convolution, `activation(conv(x, kernel) + bias)`, as Keras's `Conv2D`: a kernel of
/// shape `[kh, kw, in_channels, filters]` (Glorot-uniform), a zero bias, stride, `valid` or
/// `same` padding and dilation; inputs `[n, h, w, c]`.
#[derive(Clone, Debug)]
pub struct Conv2D {
    filters: usize,
    kernel: [usize; 2],
    strides: [usize; 2],
    dilation: [usize; 2],
    padding: Padding,
    activation: Activation,
    use_bias: bool,
    kernel_init: Initializer,
    /// The geometry for the input shape [`Layer::build`] saw.
    window: Option<Window2d>,
}

impl Conv2D {
    /// `filters` outputs per position, a `kernel` window, stride 1, `valid` padding.
    pub fn new(filters: usize, kernel: [usize; 2], activation: Activation) -> Conv2D {
        Conv2D {
            filters,
            kernel,
            strides: [1, 1],
            dilation: [1, 1],
            padding: Padding::Valid,
            activation,
            use_bias: true,
            kernel_init: Initializer::GlorotUniform,
            window: None,
        }
    }

    /// With another stride.
    pub fn strides(mut self, strides: [usize; 2]) -> Conv2D {
        self.strides = strides;
        self
    }

    /// With another padding.
    pub fn padding(mut self, padding: Padding) -> Conv2D {
        self.padding = padding;
        self
    }

    /// With another dilation rate.
    pub fn dilation(mut self, dilation: [usize; 2]) -> Conv2D {
        self.dilation = dilation;
        self
    }

    /// Without a bias.
    pub fn without_bias(mut self) -> Conv2D {
        self.use_bias = false;
        self
    }

    /// With another kernel initialiser.
    pub fn kernel_initializer(mut self, init: Initializer) -> Conv2D {
        self.kernel_init = init;
        self
    }

    fn conv<'t>(&self, x: &Var<'t>, params: &[Var<'t>]) -> Result<Var<'t>> {
        let window = self.window.as_ref().ok_or(NnError::NotBuilt)?;
        let n = x.shape().first().copied().unwrap_or(0);
        let rows = window.taps() * x.shape().last().copied().unwrap_or(0);
        let [oh, ow] = window.output;
        let z = x
            .im2col(window)?
            .reshape(&[n * oh * ow, rows])?
            .matmul(&params[0].reshape(&[rows, self.filters])?)?
            .reshape(&[n, oh, ow, self.filters])?;
        Ok(if self.use_bias { z.add(&params[1])? } else { z })
    }
}

impl Layer for Conv2D {
    fn kind(&self) -> &'static str {
        "conv2d"
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        let config = |msg: String| NnError::Config {
            layer: "conv2d".into(),
            msg,
        };
        if self.filters == 0 {
            return Err(config("filters must be positive".into()));
        }
        let [h, w, c] = hwc("conv2d", input)?;
        let window = Window2d::new(
            [h, w],
            self.kernel,
            self.strides,
            self.dilation,
            self.padding,
        )
        .map_err(config)?;
        self.window = Some(window);
        let mut specs = vec![ParamSpec::trainable(
            "kernel",
            vec![self.kernel[0], self.kernel[1], c, self.filters],
            self.kernel_init,
        )];
        if self.use_bias {
            specs.push(ParamSpec::trainable(
                "bias",
                vec![self.filters],
                Initializer::Zeros,
            ));
        }
        Ok((
            specs,
            vec![window.output[0], window.output[1], self.filters],
        ))
    }

    fn forward<'t>(
        &self,
        x: &Var<'t>,
        params: &[Var<'t>],
        _: &mut ForwardCtx<'_>,
    ) -> Result<Var<'t>> {
        self.activation.apply(&self.conv(x, params)?)
    }

    fn forward_logits<'t>(
        &self,
        x: &Var<'t>,
        params: &[Var<'t>],
        _: &mut ForwardCtx<'_>,
    ) -> Result<Option<Var<'t>>> {
        match self.activation {
            Activation::Softmax => Ok(Some(self.conv(x, params)?)),
            _ => Ok(None),
        }
    }
}

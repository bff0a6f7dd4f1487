//! Convolution layers, channels-last as Keras's: `Conv1D`, `Conv2D` and `Conv3D`, one
//! generic [`Conv`] over the number of spatial dimensions.
//!
//! A convolution is one op of the tape ([`Var::conv`]): the tensor crate computes it and
//! its gradients as the patches of its window times the kernel, or as products of
//! shifted views of the padded input, whichever suits the shape.

use mirra_autograd::Var;
use mirra_tensor::init::Initializer;
use mirra_tensor::{Padding, Window};

use crate::{Activation, Autocast, ForwardCtx, Layer, NnError, ParamSpec, Result};

/// The layer kind of a `D`-dimensional layer family: `conv` and 2 give `conv2d`.
pub(crate) fn kind_of<const D: usize>(family: &'static [&'static str; 3]) -> &'static str {
    family[D - 1]
}

/// The spatial size and channels of a layer input without its batch dimension
/// (`[d1, .., dD, c]`), or the error naming the layer.
pub(crate) fn spatial<const D: usize>(layer: &str, input: &[usize]) -> Result<([usize; D], usize)> {
    if input.len() == D + 1 {
        let mut size = [0; D];
        size.copy_from_slice(&input[..D]);
        return Ok((size, input[D]));
    }
    let names = ["steps", "height, width", "depth, height, width"];
    Err(NnError::Config {
        layer: layer.into(),
        msg: format!(
            "needs inputs [{}, channels] (channels last), got {input:?} (add a Reshape layer \
             before it)",
            names[D - 1]
        ),
    })
}

/// A convolution over `D` spatial dimensions, `activation(conv(x, kernel) + bias)`, as
/// Keras's `Conv1D`, `Conv2D` and `Conv3D`: a kernel of shape `[k1, .., kD, in_channels,
/// filters]` (Glorot-uniform), a zero bias, stride, `valid` or `same` padding and dilation;
/// inputs `[n, d1, .., dD, c]`.
#[derive(Clone, Debug)]
pub struct Conv<const D: usize> {
    filters: usize,
    kernel: [usize; D],
    strides: [usize; D],
    dilation: [usize; D],
    padding: Padding,
    activation: Activation,
    use_bias: bool,
    kernel_init: Initializer,
    /// The geometry for the input shape [`Layer::build`] saw.
    window: Option<Window>,
}

/// A 1D convolution over `[n, steps, c]` (Keras's `Conv1D`).
pub type Conv1D = Conv<1>;
/// A 2D convolution over `[n, h, w, c]` (Keras's `Conv2D`).
pub type Conv2D = Conv<2>;
/// A 3D convolution over `[n, d, h, w, c]` (Keras's `Conv3D`).
pub type Conv3D = Conv<3>;

const KINDS: [&str; 3] = ["conv1d", "conv2d", "conv3d"];

impl<const D: usize> Conv<D> {
    /// `filters` outputs per position, a `kernel` window, stride 1, `valid` padding.
    pub fn new(filters: usize, kernel: [usize; D], activation: Activation) -> Conv<D> {
        Conv {
            filters,
            kernel,
            strides: [1; D],
            dilation: [1; D],
            padding: Padding::Valid,
            activation,
            use_bias: true,
            kernel_init: Initializer::GlorotUniform,
            window: None,
        }
    }

    /// With another stride.
    pub fn strides(mut self, strides: [usize; D]) -> Conv<D> {
        self.strides = strides;
        self
    }

    /// With another padding.
    pub fn padding(mut self, padding: Padding) -> Conv<D> {
        self.padding = padding;
        self
    }

    /// With another dilation rate.
    pub fn dilation(mut self, dilation: [usize; D]) -> Conv<D> {
        self.dilation = dilation;
        self
    }

    /// Without a bias.
    pub fn without_bias(mut self) -> Conv<D> {
        self.use_bias = false;
        self
    }

    /// With another kernel initialiser.
    pub fn kernel_initializer(mut self, init: Initializer) -> Conv<D> {
        self.kernel_init = init;
        self
    }

    fn conv<'t>(&self, x: &Var<'t>, params: &[Var<'t>]) -> Result<Var<'t>> {
        let window = self.window.as_ref().ok_or(NnError::NotBuilt)?;
        let z = x.conv(&params[0], window)?;
        Ok(if self.use_bias { z.add(&params[1])? } else { z })
    }
}

impl<const D: usize> Layer for Conv<D> {
    fn autocast(&self) -> Autocast {
        // Patches times the kernel: the policy's 16-bit dtype.
        Autocast::Lower
    }

    fn kind(&self) -> &'static str {
        kind_of::<D>(&KINDS)
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        let kind = self.kind();
        let config = |msg: String| NnError::Config {
            layer: kind.into(),
            msg,
        };
        if self.filters == 0 {
            return Err(config("filters must be positive".into()));
        }
        let (size, c) = spatial::<D>(kind, input)?;
        let window = Window::new(
            &size,
            &self.kernel,
            &self.strides,
            &self.dilation,
            self.padding,
        )
        .map_err(config)?;
        self.window = Some(window);
        let mut kernel = self.kernel.to_vec();
        kernel.extend([c, self.filters]);
        let mut specs = vec![ParamSpec::trainable("kernel", kernel, self.kernel_init)];
        if self.use_bias {
            specs.push(ParamSpec::trainable(
                "bias",
                vec![self.filters],
                Initializer::Zeros,
            ));
        }
        let mut output = window.output().to_vec();
        output.push(self.filters);
        Ok((specs, output))
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

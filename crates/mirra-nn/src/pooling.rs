//! Pooling and upsampling layers, channels-last as Keras's, each generic over its number of
//! spatial dimensions (1 to 3): [`MaxPooling`] (the pooling op, which keeps each window's
//! winner for the gradient: the first of equal maxima, as TensorFlow's and PyTorch's),
//! [`AveragePooling`] (the convolution's `im2col` patches averaged over the taps, so its
//! gradient is theirs), [`GlobalAveragePooling`] and [`UpSampling`].

use mirra_autograd::Var;
use mirra_tensor::{Padding, Window};

use crate::conv::{kind_of, spatial};
use crate::{ForwardCtx, Layer, NnError, ParamSpec, Result};

/// How a pooling window reduces its taps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reduce {
    Max,
    Mean,
}

/// A pooling window of `pool`, stride `strides` (the pool size by default), `valid`
/// padding unless told otherwise.
#[derive(Clone, Debug)]
struct Pool<const D: usize> {
    kind: &'static str,
    reduce: Reduce,
    pool: [usize; D],
    strides: [usize; D],
    padding: Padding,
    window: Option<Window>,
}

impl<const D: usize> Pool<D> {
    fn new(kind: &'static str, reduce: Reduce, pool: [usize; D]) -> Pool<D> {
        Pool {
            kind,
            reduce,
            pool,
            strides: pool,
            padding: Padding::Valid,
            window: None,
        }
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        let (size, c) = spatial::<D>(self.kind, input)?;
        let config = |msg: String| NnError::Config {
            layer: self.kind.into(),
            msg,
        };
        if self.reduce == Reduce::Mean && self.padding == Padding::Same {
            // Keras averages a padded window over its taps inside the input; the patches'
            // mean would count the padded zeros.
            return Err(config(
                "same padding is not supported for average pooling (valid only)".into(),
            ));
        }
        let window =
            Window::new(&size, &self.pool, &self.strides, &[1; D], self.padding).map_err(config)?;
        self.window = Some(window);
        let mut output = window.output().to_vec();
        output.push(c);
        Ok((vec![], output))
    }

    fn forward<'t>(&self, x: &Var<'t>) -> Result<Var<'t>> {
        let window = self.window.as_ref().ok_or(NnError::NotBuilt)?;
        let d = x.shape();
        let (n, c) = (d[0], d[d.len() - 1]);
        Ok(match self.reduce {
            Reduce::Max => x.max_pool(window)?,
            Reduce::Mean => {
                let mut taps = vec![n];
                taps.extend_from_slice(window.output());
                taps.extend([window.taps(), c]);
                x.im2col(window)?
                    .reshape(&taps)?
                    .mean(&[D as isize + 1], false)?
            }
        })
    }
}

macro_rules! pooling_layer {
    ($(#[$doc:meta])* $name:ident, $kinds:expr, $reduce:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name<const D: usize>(Pool<D>);

        impl<const D: usize> $name<D> {
            /// A `pool` window with stride `pool` (non-overlapping), `valid` padding.
            pub fn new(pool: [usize; D]) -> $name<D> {
                $name(Pool::new(kind_of::<D>(&$kinds), $reduce, pool))
            }

            /// With another stride.
            pub fn strides(mut self, strides: [usize; D]) -> $name<D> {
                self.0.strides = strides;
                self
            }

            /// With another padding (`same`: taps outside the input never win a max).
            pub fn padding(mut self, padding: Padding) -> $name<D> {
                self.0.padding = padding;
                self
            }
        }

        impl<const D: usize> Layer for $name<D> {
            fn kind(&self) -> &'static str {
                self.0.kind
            }

            fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
                self.0.build(input)
            }

            fn forward<'t>(
                &self,
                x: &Var<'t>,
                _: &[Var<'t>],
                _: &mut ForwardCtx<'_>,
            ) -> Result<Var<'t>> {
                self.0.forward(x)
            }
        }
    };
}

pooling_layer!(
    /// The largest value of each window, per channel, as Keras's `MaxPooling1D`, `2D` and
    /// `3D` (`valid` padding by default; `same` too).
    MaxPooling,
    ["max_pooling1d", "max_pooling2d", "max_pooling3d"],
    Reduce::Max
);
pooling_layer!(
    /// The mean of each window, per channel, as Keras's `AveragePooling1D`, `2D` and `3D`
    /// (`valid` padding only).
    AveragePooling,
    ["average_pooling1d", "average_pooling2d", "average_pooling3d"],
    Reduce::Mean
);

/// Max pooling over `[n, steps, c]`.
pub type MaxPooling1D = MaxPooling<1>;
/// Max pooling over `[n, h, w, c]`.
pub type MaxPooling2D = MaxPooling<2>;
/// Max pooling over `[n, d, h, w, c]`.
pub type MaxPooling3D = MaxPooling<3>;
/// Average pooling over `[n, steps, c]`.
pub type AveragePooling1D = AveragePooling<1>;
/// Average pooling over `[n, h, w, c]`.
pub type AveragePooling2D = AveragePooling<2>;
/// Average pooling over `[n, d, h, w, c]`.
pub type AveragePooling3D = AveragePooling<3>;

/// Repeats every element `size[i]` times along spatial dimension `i` (nearest neighbour):
/// `[n, d1, .., dD, c]` to `[n, d1 * s1, .., dD * sD, c]`, as Keras's `UpSampling1D`, `2D`
/// and `3D`, a U-Net decoder's step up. A broadcast of a view, so its gradient sums each
/// block back.
#[derive(Clone, Debug)]
pub struct UpSampling<const D: usize> {
    size: [usize; D],
}

/// Upsampling of `[n, steps, c]`.
pub type UpSampling1D = UpSampling<1>;
/// Upsampling of `[n, h, w, c]`.
pub type UpSampling2D = UpSampling<2>;
/// Upsampling of `[n, d, h, w, c]`.
pub type UpSampling3D = UpSampling<3>;

impl<const D: usize> UpSampling<D> {
    /// Each element repeated `size[i]` times along spatial dimension `i`.
    pub fn new(size: [usize; D]) -> UpSampling<D> {
        UpSampling { size }
    }
}

impl<const D: usize> Layer for UpSampling<D> {
    fn kind(&self) -> &'static str {
        kind_of::<D>(&["up_sampling1d", "up_sampling2d", "up_sampling3d"])
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        let (size, c) = spatial::<D>(self.kind(), input)?;
        if self.size.contains(&0) {
            return Err(NnError::Config {
                layer: self.kind().into(),
                msg: format!("size {:?} must be at least 1", self.size),
            });
        }
        let mut output: Vec<usize> = size.iter().zip(self.size).map(|(d, s)| d * s).collect();
        output.push(c);
        Ok((vec![], output))
    }

    fn forward<'t>(&self, x: &Var<'t>, _: &[Var<'t>], _: &mut ForwardCtx<'_>) -> Result<Var<'t>> {
        // [n, d1, 1, .., dD, 1, c] broadcast to [n, d1, s1, .., dD, sD, c].
        let d = x.shape();
        let (n, c) = (d[0], d[D + 1]);
        let (mut view, mut wide, mut out) = (vec![n], vec![n], vec![n]);
        for (i, &s) in self.size.iter().enumerate() {
            view.extend([d[i + 1], 1]);
            wide.extend([d[i + 1], s]);
            out.push(d[i + 1] * s);
        }
        view.push(c);
        wide.push(c);
        out.push(c);
        Ok(x.reshape(&view)?.broadcast_to(&wide)?.reshape(&out)?)
    }
}

/// The mean over the spatial dimensions, per channel: `[n, d1, .., dD, c]` to `[n, c]`, as
/// Keras's `GlobalAveragePooling1D`, `2D` and `3D`.
#[derive(Clone, Debug, Default)]
pub struct GlobalAveragePooling<const D: usize>;

/// Global average pooling of `[n, steps, c]`.
pub type GlobalAveragePooling1D = GlobalAveragePooling<1>;
/// Global average pooling of `[n, h, w, c]`.
pub type GlobalAveragePooling2D = GlobalAveragePooling<2>;
/// Global average pooling of `[n, d, h, w, c]`.
pub type GlobalAveragePooling3D = GlobalAveragePooling<3>;

impl<const D: usize> Layer for GlobalAveragePooling<D> {
    fn kind(&self) -> &'static str {
        kind_of::<D>(&[
            "global_average_pooling1d",
            "global_average_pooling2d",
            "global_average_pooling3d",
        ])
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        let (_, c) = spatial::<D>(self.kind(), input)?;
        Ok((vec![], vec![c]))
    }

    fn forward<'t>(&self, x: &Var<'t>, _: &[Var<'t>], _: &mut ForwardCtx<'_>) -> Result<Var<'t>> {
        let axes: Vec<isize> = (1..=D as isize).collect();
        Ok(x.mean(&axes, false)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Activation, Conv1D, Conv2D, Conv3D, Flatten, Reshape, Sequential};
    use mirra_tensor::{Device, Tensor};

    fn predict(layers: Vec<Box<dyn Layer>>, input: &[usize], x: &[f32]) -> (Vec<usize>, Vec<f32>) {
        let mut net = Sequential::new(layers);
        net.build(input, 1).unwrap();
        let mut dims = vec![1];
        dims.extend(input);
        let y = net
            .predict(Tensor::from_slice(x, &dims, Device::Cpu).unwrap())
            .unwrap();
        (y.dims().to_vec(), y.to_vec::<f32>().unwrap())
    }

    #[test]
    fn pooling_takes_the_max_or_mean_of_each_window() {
        // One 4x4 channel: windows of 2x2 with stride 2.
        let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let (d, y) = predict(vec![Box::new(MaxPooling2D::new([2, 2]))], &[4, 4, 1], &x);
        assert_eq!((d, y), (vec![1, 2, 2, 1], vec![5.0, 7.0, 13.0, 15.0]));
        let (d, y) = predict(
            vec![Box::new(AveragePooling2D::new([2, 2]))],
            &[4, 4, 1],
            &x,
        );
        assert_eq!((d, y), (vec![1, 2, 2, 1], vec![2.5, 4.5, 10.5, 12.5]));
        // Overlapping windows (stride 1), two channels kept apart.
        let x2: Vec<f32> = (0..9).flat_map(|i| [i as f32, -(i as f32)]).collect();
        let pool = MaxPooling2D::new([2, 2]).strides([1, 1]);
        let (d, y) = predict(vec![Box::new(pool)], &[3, 3, 2], &x2);
        assert_eq!(d, vec![1, 2, 2, 2]);
        assert_eq!(y, vec![4.0, 0.0, 5.0, -1.0, 7.0, -3.0, 8.0, -4.0]);
        let (d, y) = predict(
            vec![Box::new(GlobalAveragePooling2D::default())],
            &[3, 3, 2],
            &x2,
        );
        assert_eq!((d, y), (vec![1, 2], vec![4.0, -4.0]));
        // Upsampling repeats each pixel: [[1, 2], [3, 4]] by 2 down and 3 across.
        let (d, y) = predict(
            vec![Box::new(UpSampling2D::new([2, 3]))],
            &[2, 2, 1],
            &[1., 2., 3., 4.],
        );
        assert_eq!(d, vec![1, 4, 6, 1]);
        assert_eq!(
            y,
            [
                1., 1., 1., 2., 2., 2., 1., 1., 1., 2., 2., 2., 3., 3., 3., 4., 4., 4., 3., 3., 3.,
                4., 4., 4.
            ]
        );
    }

    #[test]
    fn shapes_flow_through_conv_and_pooling() {
        let mut net = Sequential::new(vec![
            Box::new(Reshape::new(&[12, 10, 1])),
            Box::new(Conv2D::new(4, [3, 3], Activation::Relu).padding(Padding::Same)),
            Box::new(Conv2D::new(6, [3, 3], Activation::Relu).strides([2, 2])),
            Box::new(MaxPooling2D::new([2, 2])),
            Box::new(Flatten),
        ]);
        net.build(&[120], 1).unwrap();
        // same keeps 12x10; valid stride 2: (12-3)/2+1 = 5, (10-3)/2+1 = 4; pool: 2x2.
        let y = net
            .predict(Tensor::zeros(&[3, 120], mirra_tensor::DType::F32, Device::Cpu).unwrap())
            .unwrap();
        assert_eq!(y.dims(), &[3, 2 * 2 * 6]);
    }

    #[test]
    fn three_dimensional_layers_on_one_slice_are_the_2d_layers() {
        // A volume of depth 1 through Conv3D (kernel [1, 3, 3], the same weights) and 3D
        // pooling gives what the 2D layers give the image: one window walk serves both.
        let (h, w, c) = (6, 5, 2);
        let x: Vec<f32> = (0..h * w * c)
            .map(|i| ((i * 17) % 13) as f32 - 6.0)
            .collect();
        let two: Vec<Box<dyn Layer>> = vec![
            Box::new(Conv2D::new(3, [3, 3], Activation::Relu).padding(Padding::Same)),
            Box::new(MaxPooling2D::new([2, 2])),
            Box::new(UpSampling2D::new([2, 3])),
            Box::new(AveragePooling2D::new([2, 3])),
        ];
        let three: Vec<Box<dyn Layer>> = vec![
            Box::new(Conv3D::new(3, [1, 3, 3], Activation::Relu).padding(Padding::Same)),
            Box::new(MaxPooling3D::new([1, 2, 2])),
            Box::new(UpSampling3D::new([1, 2, 3])),
            Box::new(AveragePooling3D::new([1, 2, 3])),
        ];
        let mut net2 = Sequential::new(two);
        net2.build(&[h, w, c], 7).unwrap();
        let mut net3 = Sequential::new(three);
        net3.build(&[1, h, w, c], 7).unwrap();
        // The kernels differ in shape only ([3, 3, 2, 3] against [1, 3, 3, 2, 3]).
        let weights: Vec<Tensor> = net2
            .params()
            .iter()
            .zip(net3.params())
            .map(|(p2, p3)| p2.reshape(p3.dims()).unwrap())
            .collect();
        net3.set_params(weights).unwrap();
        let y2 = net2
            .predict(Tensor::from_slice(&x, &[1, h, w, c], Device::Cpu).unwrap())
            .unwrap();
        let y3 = net3
            .predict(Tensor::from_slice(&x, &[1, 1, h, w, c], Device::Cpu).unwrap())
            .unwrap();
        assert_eq!(y2.dims(), &[1, 3, 2, 3]);
        assert_eq!(y3.dims(), &[1, 1, 3, 2, 3]);
        assert_eq!(y2.to_vec::<f32>().unwrap(), y3.to_vec::<f32>().unwrap());
        // Along depth: a 2x2x2 cube of 0..8 pooled to its largest, upsampled back, averaged.
        let cube: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let (d, y) = predict(
            vec![Box::new(MaxPooling3D::new([2, 1, 1]))],
            &[2, 2, 2, 1],
            &cube,
        );
        assert_eq!((d, y), (vec![1, 1, 2, 2, 1], vec![4., 5., 6., 7.]));
        let (d, y) = predict(
            vec![Box::new(UpSampling3D::new([2, 1, 1]))],
            &[1, 2, 2, 1],
            &[1., 2., 3., 4.],
        );
        assert_eq!(
            (d, y),
            (vec![1, 2, 2, 2, 1], vec![1., 2., 3., 4., 1., 2., 3., 4.])
        );
        let (d, y) = predict(
            vec![Box::new(GlobalAveragePooling3D::default())],
            &[2, 2, 2, 1],
            &cube,
        );
        assert_eq!((d, y), (vec![1, 1], vec![3.5]));
        let (d, y) = predict(
            vec![Box::new(
                Conv1D::new(1, [2], Activation::Linear)
                    .kernel_initializer(mirra_tensor::init::Initializer::Ones),
            )],
            &[4, 1],
            &[1., 2., 3., 4.],
        );
        assert_eq!((d, y), (vec![1, 3, 1], vec![3., 5., 7.]));
    }

    #[test]
    fn bad_configurations_are_errors_naming_the_layer() {
        let build = |layers: Vec<Box<dyn Layer>>, input: &[usize]| {
            Sequential::new(layers)
                .build(input, 1)
                .unwrap_err()
                .to_string()
        };
        let e = build(
            vec![Box::new(Conv2D::new(4, [3, 3], Activation::Relu))],
            &[28, 28],
        );
        assert!(
            e.starts_with("conv2d: needs inputs [height, width, channels]"),
            "{e}"
        );
        let e = build(
            vec![Box::new(Conv2D::new(0, [3, 3], Activation::Relu))],
            &[5, 5, 1],
        );
        assert_eq!(e, "conv2d: filters must be positive");
        let e = build(
            vec![Box::new(Conv2D::new(2, [7, 7], Activation::Relu))],
            &[5, 5, 1],
        );
        assert!(e.contains("does not fit in an input of 5"), "{e}");
        let e = build(
            vec![Box::new(Conv3D::new(4, [3, 3, 3], Activation::Relu))],
            &[28, 28, 1],
        );
        assert!(
            e.starts_with("conv3d: needs inputs [depth, height, width, channels]"),
            "{e}"
        );
        let e = build(
            vec![Box::new(
                AveragePooling2D::new([2, 2]).padding(Padding::Same),
            )],
            &[4, 4, 1],
        );
        assert!(e.contains("same padding is not supported"), "{e}");
        let e = build(vec![Box::new(MaxPooling2D::new([3, 3]))], &[2, 2, 1]);
        assert!(e.starts_with("max_pooling2d:"), "{e}");
        let e = build(vec![Box::new(Reshape::new(&[28, 27, 1]))], &[28, 28]);
        assert_eq!(
            e,
            "reshape: inputs [28, 28] have 784 elements, the target [28, 27, 1] 756"
        );
    }
}

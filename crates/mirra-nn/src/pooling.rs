//! Pooling and upsampling layers, channels-last as Keras's: `MaxPooling2D` (the pooling op, which keeps
//! each window's winner for the gradient: the first of equal maxima, as TensorFlow's and
//! PyTorch's), `AveragePooling2D` (the convolution's `im2col` patches averaged over the
//! taps, so its gradient is theirs), `GlobalAveragePooling2D`.

use mirra_autograd::Var;
use mirra_tensor::{Padding, Window2d};

use crate::conv::hwc;
use crate::{ForwardCtx, Layer, NnError, ParamSpec, Result};

/// How a pooling window reduces its taps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reduce {
    Max,
    Mean,
}

/// A pooling window of `pool`, stride `strides` (the pool size by default), `valid`
/// padding.
#[derive(Clone, Debug)]
struct Pool2d {
    kind: &'static str,
    reduce: Reduce,
    pool: [usize; 2],
    strides: [usize; 2],
    window: Option<Window2d>,
}

impl Pool2d {
    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        let [h, w, c] = hwc(self.kind, input)?;
        let window = Window2d::new([h, w], self.pool, self.strides, [1, 1], Padding::Valid)
            .map_err(|msg| NnError::Config {
                layer: self.kind.into(),
                msg,
            })?;
        self.window = Some(window);
        Ok((vec![], vec![window.output[0], window.output[1], c]))
    }

    fn forward<'t>(&self, x: &Var<'t>) -> Result<Var<'t>> {
        let window = self.window.as_ref().ok_or(NnError::NotBuilt)?;
        let d = x.shape();
        let (n, c) = (d[0], d[d.len() - 1]);
        let [oh, ow] = window.output;
        Ok(match self.reduce {
            Reduce::Max => x.max_pool2d(window)?,
            Reduce::Mean => x
                .im2col(window)?
                .reshape(&[n, oh, ow, window.taps(), c])?
                .mean(&[3], false)?,
        })
    }
}

macro_rules! pooling_layer {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $reduce:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name(Pool2d);

        impl $name {
            /// A `pool` window with stride `pool` (non-overlapping), `valid` padding.
            pub fn new(pool: [usize; 2]) -> $name {
                $name(Pool2d {
                    kind: $kind,
                    reduce: $reduce,
                    pool,
                    strides: pool,
                    window: None,
                })
            }

            /// With another stride.
            pub fn strides(mut self, strides: [usize; 2]) -> $name {
                self.0.strides = strides;
                self
            }
        }

        impl Layer for $name {
            fn kind(&self) -> &'static str {
                $kind
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
    /// The largest value of each window, per channel, as Keras's `MaxPooling2D` (`valid`
    /// padding).
    MaxPooling2D,
    "max_pooling2d",
    Reduce::Max
);
pooling_layer!(
    /// The mean of each window, per channel, as Keras's `AveragePooling2D` (`valid`
    /// padding).
    AveragePooling2D,
    "average_pooling2d",
    Reduce::Mean
);

/// Repeats every row and column `size` times (nearest neighbour): `[n, h, w, c]` to
/// `[n, h * sh, w * sw, c]`, as Keras's `UpSampling2D`, a U-Net decoder's step up. A
/// broadcast of a view, so its gradient sums each block back.
#[derive(Clone, Debug)]
pub struct UpSampling2D {
    size: [usize; 2],
}

impl UpSampling2D {
    /// Each pixel repeated `size` times down and across.
    pub fn new(size: [usize; 2]) -> UpSampling2D {
        UpSampling2D { size }
    }
}

impl Layer for UpSampling2D {
    fn kind(&self) -> &'static str {
        "up_sampling2d"
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        let [h, w, c] = hwc("up_sampling2d", input)?;
        if self.size.contains(&0) {
            return Err(NnError::Config {
                layer: "up_sampling2d".into(),
                msg: format!("size {:?} must be at least 1", self.size),
            });
        }
        Ok((vec![], vec![h * self.size[0], w * self.size[1], c]))
    }

    fn forward<'t>(&self, x: &Var<'t>, _: &[Var<'t>], _: &mut ForwardCtx<'_>) -> Result<Var<'t>> {
        let d = x.shape();
        let (n, h, w, c) = (d[0], d[1], d[2], d[3]);
        let [sh, sw] = self.size;
        Ok(x.reshape(&[n, h, 1, w, 1, c])?
            .broadcast_to(&[n, h, sh, w, sw, c])?
            .reshape(&[n, h * sh, w * sw, c])?)
    }
}

/// The mean over height and width, per channel: `[n, h, w, c]` to `[n, c]`, as Keras's
/// `GlobalAveragePooling2D`.
#[derive(Clone, Debug, Default)]
pub struct GlobalAveragePooling2D;

impl Layer for GlobalAveragePooling2D {
    fn kind(&self) -> &'static str {
        "global_average_pooling2d"
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        let [_, _, c] = hwc("global_average_pooling2d", input)?;
        Ok((vec![], vec![c]))
    }

    fn forward<'t>(&self, x: &Var<'t>, _: &[Var<'t>], _: &mut ForwardCtx<'_>) -> Result<Var<'t>> {
        Ok(x.mean(&[1, 2], false)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Activation, Conv2D, Flatten, Reshape, Sequential};
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
        let (d, y) = predict(vec![Box::new(GlobalAveragePooling2D)], &[3, 3, 2], &x2);
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
        let e = build(vec![Box::new(MaxPooling2D::new([3, 3]))], &[2, 2, 1]);
        assert!(e.starts_with("max_pooling2d:"), "{e}");
        let e = build(vec![Box::new(Reshape::new(&[28, 27, 1]))], &[28, 28]);
        assert_eq!(
            e,
            "reshape: inputs [28, 28] have 784 elements, the target [28, 27, 1] 756"
        );
    }
}

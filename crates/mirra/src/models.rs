//! Models known to the command line by name.

use mirra_nn::{Activation, Dense, Flatten, Sequential};

/// The names `mirra train --model` accepts.
pub const MODEL_NAMES: &[&str] = &["mlp"];

/// The model called `name`, not yet built; `None` for an unknown name.
pub fn by_name(name: &str) -> Option<Sequential> {
    match name {
        "mlp" => Some(mlp()),
        _ => None,
    }
}

/// The MNIST MLP of the reference recipe: Flatten -> Dense(128, relu) -> Dense(64, relu)
/// -> Dense(10, softmax).
pub fn mlp() -> Sequential {
    Sequential::new(vec![
        Box::new(Flatten),
        Box::new(Dense::new(128, Activation::Relu)),
        Box::new(Dense::new(64, Activation::Relu)),
        Box::new(Dense::new(10, Activation::Softmax)),
    ])
}

//! The functional API's builder (Keras's `inputs = keras.Input(...)`, `x = layer(x)`):
//! layers called on symbolic outputs, from which [`Network::functional`] makes a model.
//!
//! [`Network::functional`]: crate::Network::functional

use crate::Layer;

/// A symbolic value of a [`Graph`]: the model's input, or the output of a layer called on
/// other symbols.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Symbol(pub(crate) usize);

/// Layers and what each is called on, in the order they were called (which is a
/// topological order: a layer can only be called on symbols that exist).
///
/// ```
/// use mirra_nn::{Activation, Add, Dense, Graph, Network};
///
/// let mut g = Graph::new();
/// let x = g.input();
/// let h = g.call(Dense::new(4, Activation::Relu), x);
/// let h = g.call(Dense::new(4, Activation::Linear), h);
/// let y = g.merge(Add, &[h, x]); // a residual connection
/// let mut net = Network::functional(g, y).unwrap();
/// net.build(&[4], 0).unwrap();
/// assert_eq!(net.param_names(), ["dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"]);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub(crate) nodes: Vec<(Box<dyn Layer>, Vec<Symbol>)>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// The model's input (its shape is given when the model is built).
    pub fn input(&self) -> Symbol {
        Symbol(0)
    }

    /// The output of `layer` called on `x`.
    pub fn call(&mut self, layer: impl Layer + 'static, x: Symbol) -> Symbol {
        self.merge(layer, &[x])
    }

    /// The output of `layer` called on several symbols (`Add`, `Concatenate`).
    pub fn merge(&mut self, layer: impl Layer + 'static, xs: &[Symbol]) -> Symbol {
        self.nodes.push((Box::new(layer), xs.to_vec()));
        Symbol(self.nodes.len())
    }
}

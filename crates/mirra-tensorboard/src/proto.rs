//! The protobuf messages of an event file, declared by hand with `prost` (no `protoc`).
//!
//! Field numbers and types are those of TensorFlow's `tensorflow/core/util/event.proto`
//! and `tensorflow/core/framework/summary.proto`. Only the fields mirra writes are
//! declared; a decoder skips the others (graphs, histograms, images, ...), as protobuf
//! decoders skip unknown fields.

/// One entry of an event file (`tensorflow.Event`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the Unix epoch when the event was written.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The training step (mirra and Keras: the 0-based epoch) the event belongs to.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// What the event holds.
    #[prost(oneof = "event::What", tags = "3, 5")]
    pub what: Option<event::What>,
}

/// Nested types of [`Event`].
pub mod event {
    /// The `what` one-of of `tensorflow.Event` (the variants mirra uses).
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum What {
        /// The format version, `brain.Event:2`, in the first event of a file.
        #[prost(string, tag = "3")]
        FileVersion(String),
        /// Summary values (scalars).
        #[prost(message, tag = "5")]
        Summary(super::Summary),
    }
}

/// Values logged at one step (`tensorflow.Summary`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    /// The values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<summary::Value>,
}

/// Nested types of [`Summary`].
pub mod summary {
    /// One tagged value (`tensorflow.Summary.Value`).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Value {
        /// The name TensorBoard shows and groups by (`epoch_loss`).
        #[prost(string, tag = "1")]
        pub tag: String,
        /// A scalar: `simple_value` of the `value` one-of (field 2, `float`). The other
        /// members of the one-of are not declared; `None` when the value is one of them.
        #[prost(float, optional, tag = "2")]
        pub simple_value: Option<f32>,
    }
}

impl Event {
    /// The event's scalars as `(tag, value)`, in order; empty for other events.
    pub fn scalars(&self) -> impl Iterator<Item = (&str, f32)> {
        let values = match &self.what {
            Some(event::What::Summary(s)) => s.value.as_slice(),
            _ => &[],
        };
        values
            .iter()
            .filter_map(|v| v.simple_value.map(|x| (v.tag.as_str(), x)))
    }
}

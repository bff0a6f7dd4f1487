/// Everything the model can refuse. Each variant names the topology, model or value at
/// fault, so that a command-line error is one self-explanatory line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScalingError {
    /// No preset topology of that name.
    #[error("unknown topology `{name}`; known: {known}")]
    UnknownTopology {
        /// The name asked for.
        name: String,
        /// The preset names, comma-separated.
        known: String,
    },
    /// No model profile of that name.
    #[error("unknown model `{name}`; known: {known}")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The model names, comma-separated.
        known: String,
    },
    /// More replicas (or fewer than one) than the topology has devices.
    #[error("{replicas} replicas do not fit topology `{topology}`, which has {devices} devices")]
    ReplicasOutOfRange {
        /// The topology's name.
        topology: String,
        /// The replica count asked for.
        replicas: usize,
        /// The devices the topology has.
        devices: usize,
    },
    /// A topology that cannot be built as asked (a bad link, a node id out of range).
    #[error("topology `{topology}`: {reason}")]
    InvalidTopology {
        /// The topology's name.
        topology: String,
        /// What is wrong.
        reason: String,
    },
    /// Two nodes that no chain of links joins.
    #[error("topology `{topology}`: no route from `{from}` to `{to}`")]
    NoRoute {
        /// The topology's name.
        topology: String,
        /// The source node.
        from: String,
        /// The destination node.
        to: String,
    },
    /// A model profile with no layers, no parameters, or a time that is not a finite,
    /// non-negative number of seconds.
    #[error("model profile `{model}`: {reason}")]
    InvalidProfile {
        /// The profile's name.
        model: String,
        /// What is wrong.
        reason: String,
    },
    /// No cited single-device throughput exists for this model on this device, so its
    /// compute time cannot be taken from a public figure.
    #[error("no cited {model} throughput for device {device}; give measured timings instead")]
    NoThroughputFigure {
        /// The model.
        model: String,
        /// The device.
        device: String,
    },
    /// No ablation of that name.
    #[error("unknown ablation `{name}`; known: {known}")]
    UnknownAblation {
        /// The name asked for.
        name: String,
        /// The ablation names, comma-separated.
        known: String,
    },
    /// A measurement of this host that the host model cannot use (a copy rate that is not a
    /// positive number, no timing for a thread count it needs).
    #[error("host measurement: {reason}")]
    InvalidHostMeasurement {
        /// What is wrong.
        reason: String,
    },
    /// A bucket cap or message size of zero bytes.
    #[error("{what} must be at least one byte")]
    ZeroBytes {
        /// What was zero (`bucket cap`, `message size`).
        what: &'static str,
    },
}

/// The crate's result type.
pub type Result<T, E = ScalingError> = std::result::Result<T, E>;

//! Discrete-event simulator (work in progress).

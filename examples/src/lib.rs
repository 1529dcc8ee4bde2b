//! Shared bits of the examples: nothing yet beyond the examples themselves.

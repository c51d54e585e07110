//! What a delivery passes before it is logged, apart from HTTP itself: the publishers'
//! signature schemes ([`signature`]), their handshakes ([`handshake`]), the presets that
//! configure both ([`presets`]), which headers are kept with an event ([`kept_headers`]), and
//! which peers are believed for the client's address ([`peers`]).

pub mod handshake;
pub mod kept_headers;
pub mod peers;
pub mod presets;
pub mod signature;

//! libFuzzer target: any byte string, decoded as a stream of frames, must
//! give messages or errors, never a panic; an accepted message must
//! re-encode to bytes that decode again.
#![no_main]

use charm_proto::frame::{decode, encode, FrameError};
use charm_proto::MAX_FRAME_LEN;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    loop {
        match decode(rest, MAX_FRAME_LEN) {
            Ok((msg, used)) => {
                let again = encode(&msg).expect("an accepted message encodes");
                let (back, _) = decode(&again, MAX_FRAME_LEN).expect("a re-encoded message decodes");
                assert_eq!(encode(&back).expect("encodes"), again);
                rest = &rest[used..];
            }
            Err(FrameError::Incomplete { .. }) | Err(_) => break,
        }
    }
});

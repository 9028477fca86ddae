//! TODO(frames): HPACK — being written.

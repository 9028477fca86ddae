//! TODO(frames): packet codec — being written.

//! TODO(frames): connect codec — being written.

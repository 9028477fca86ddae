//! TODO(frames): HTTP/2 frames — being written.

//! The fast lane's byte helpers: bounded reads of a chunk's fields and LEB128 varints.

use crate::error::{Error, Result};

pub(super) fn bad(msg: impl Into<String>) -> Error {
    Error::Corrupt(format!("fast lane: {}", msg.into()))
}

pub(super) fn take<'a>(r: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if r.len() < n {
        return Err(bad("truncated chunk"));
    }
    let (head, rest) = r.split_at(n);
    *r = rest;
    Ok(head)
}

pub(super) fn write_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// LEB128, at most three bytes (every field it reads is below 2^21).
pub(super) fn read_varint(r: &mut &[u8]) -> Result<u32> {
    let mut v = 0u32;
    for i in 0..3 {
        let b = take(r, 1)?[0];
        v |= ((b & 0x7F) as u32) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("a table field is too long"))
}

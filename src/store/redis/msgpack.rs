//! The little MessagePack the batch script speaks: one array of integers
//! each way (Redis's Lua has `cmsgpack`, written in C).
//!
//! Why not one argument per number: every argument is a string Redis
//! parses, allocates, hands to Lua (which interns it) and `tonumber`
//! converts back; nine per request made that conversion a large share of
//! Redis's time per decision. One binary argument is parsed once, in C, into
//! Lua numbers. The reply likewise is one string instead of an array of
//! integers for the client to parse one by one.

/// The largest integer a Lua number (a double) holds exactly.
const EXACT: u64 = 1 << 53;

/// Writes an array of unsigned integers.
pub(super) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An array of `len` integers follows.
    pub(super) fn array(len: usize) -> Self {
        let mut buf = Vec::with_capacity(5 + len * 3);
        match u32::try_from(len) {
            Ok(n) if n < 16 => buf.push(0x90 | n as u8),
            Ok(n) if n <= u32::from(u16::MAX) => {
                buf.push(0xdc);
                buf.extend_from_slice(&(n as u16).to_be_bytes());
            }
            // Batches are bounded far below 2^32 numbers (`BatchBounds`).
            _ => {
                buf.push(0xdd);
                buf.extend_from_slice(&(len.min(u32::MAX as usize) as u32).to_be_bytes());
            }
        }
        Self { buf }
    }

    /// The next integer, in its shortest form.
    pub(super) fn uint(&mut self, v: u64) -> &mut Self {
        if v < 0x80 {
            self.buf.push(v as u8);
        } else if v <= u64::from(u8::MAX) {
            self.buf.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= u64::from(u16::MAX) {
            self.buf.push(0xcd);
            self.buf.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= u64::from(u32::MAX) {
            self.buf.push(0xce);
            self.buf.extend_from_slice(&(v as u32).to_be_bytes());
        } else if v <= EXACT {
            self.buf.push(0xcf);
            self.buf.extend_from_slice(&v.to_be_bytes());
        } else {
            // cmsgpack reads uint 64 as signed (2^64 - 1 becomes -1), and a
            // Lua number holds integers exactly only up to 2^53: above, the
            // nearest double, as `tonumber` of the decimal would give.
            self.buf.push(0xcb);
            self.buf.extend_from_slice(&(v as f64).to_be_bytes());
        }
        self
    }

    /// The next value, a string of `bytes` (any bytes: Lua's strings are).
    pub(super) fn str(&mut self, bytes: &[u8]) -> &mut Self {
        match u16::try_from(bytes.len()) {
            Ok(n) if n <= u16::from(u8::MAX) => self.buf.extend_from_slice(&[0xd9, n as u8]),
            Ok(n) => {
                self.buf.push(0xda);
                self.buf.extend_from_slice(&n.to_be_bytes());
            }
            Err(_) => {
                self.buf.push(0xdb);
                let n = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
                self.buf.extend_from_slice(&n.to_be_bytes());
            }
        }
        self.buf.extend_from_slice(bytes);
        self
    }

    pub(super) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads an array of numbers as `cmsgpack.pack` writes them (integers in
/// their shortest form; a number with a fraction as a double, truncated
/// here). `None` for anything else.
pub(super) fn read_numbers(bytes: &[u8]) -> Option<Vec<i64>> {
    let mut r = Reader { bytes, at: 0 };
    let len = match r.byte()? {
        b @ 0x90..=0x9f => usize::from(b & 0x0f),
        0xdc => usize::from(u16::from_be_bytes(r.take()?)),
        0xdd => u32::from_be_bytes(r.take()?) as usize,
        _ => return None,
    };
    // Each number is at least a byte: a length beyond the reply is a lie.
    if len > bytes.len() {
        return None;
    }
    let mut out = Vec::with_capacity(len);
    for _ in 0..len {
        out.push(r.number()?);
    }
    (r.at == bytes.len()).then_some(out)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let out = self.bytes.get(self.at..self.at + N)?.try_into().ok()?;
        self.at += N;
        Some(out)
    }

    fn number(&mut self) -> Option<i64> {
        Some(match self.byte()? {
            b @ 0x00..=0x7f => i64::from(b),
            b @ 0xe0..=0xff => i64::from(b as i8),
            0xcc => i64::from(self.byte()?),
            0xcd => i64::from(u16::from_be_bytes(self.take()?)),
            0xce => i64::from(u32::from_be_bytes(self.take()?)),
            0xcf => i64::try_from(u64::from_be_bytes(self.take()?)).unwrap_or(i64::MAX),
            0xd0 => i64::from(self.byte()? as i8),
            0xd1 => i64::from(i16::from_be_bytes(self.take()?)),
            0xd2 => i64::from(i32::from_be_bytes(self.take()?)),
            0xd3 => i64::from_be_bytes(self.take()?),
            // `as` saturates: no float can overflow into garbage.
            0xca => f32::from_be_bytes(self.take()?) as i64,
            0xcb => f64::from_be_bytes(self.take()?) as i64,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `uint` writes, read back by the same reader (cmsgpack's forms).
    fn round_trip(values: &[u64]) -> Vec<i64> {
        let mut w = Writer::array(values.len());
        for &v in values {
            w.uint(v);
        }
        read_numbers(&w.into_bytes()).expect("a valid array")
    }

    #[test]
    fn integers_of_every_width_round_trip() {
        let values = [
            0,
            1,
            0x7f,
            0x80,
            0xff,
            0x100,
            0xffff,
            0x1_0000,
            0xffff_ffff,
            0x1_0000_0000,
            1_764_500_000_000_000,
            EXACT,
        ];
        let expected: Vec<i64> = values.iter().map(|&v| v as i64).collect();
        assert_eq!(round_trip(&values), expected);
    }

    #[test]
    fn integers_above_2_pow_53_go_as_the_nearest_double() {
        let mut w = Writer::array(3);
        w.uint(EXACT + 1).uint(1 << 63).uint(u64::MAX);
        let bytes = w.into_bytes();
        // Never as uint 64, which cmsgpack would read as negative.
        assert_eq!(bytes.iter().filter(|&&b| b == 0xcb).count(), 3);
        assert!(!bytes.contains(&0xcf));
        // Read back saturated, never wrapped to a negative number.
        assert_eq!(
            read_numbers(&bytes),
            Some(vec![EXACT as i64, i64::MAX, i64::MAX])
        );
    }

    #[test]
    fn array_lengths_of_every_form() {
        for len in [0usize, 15, 16, 65_535, 65_536] {
            let values: Vec<u64> = (0..len as u64).collect();
            assert_eq!(round_trip(&values).len(), len);
        }
    }

    #[test]
    fn negative_and_fractional_numbers_are_read() {
        // -1 (negative fixint), -200 (int16), 2.5 (double), -3 (int8 form).
        let mut bytes = vec![0x94, 0xff, 0xd1];
        bytes.extend_from_slice(&(-200i16).to_be_bytes());
        bytes.push(0xcb);
        bytes.extend_from_slice(&2.5f64.to_be_bytes());
        bytes.extend_from_slice(&[0xd0, (-3i8) as u8]);
        assert_eq!(read_numbers(&bytes), Some(vec![-1, -200, 2, -3]));
    }

    #[test]
    fn malformed_replies_are_refused() {
        // Not an array; a string inside; cut short; bytes left over; a
        // length far beyond the bytes.
        for bytes in [
            &[0x01][..],
            &[0x91, 0xa1, b'x'][..],
            &[0x92, 0x01][..],
            &[0x91, 0x01, 0x02][..],
            &[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01][..],
            &[][..],
        ] {
            assert_eq!(read_numbers(bytes), None, "{bytes:?}");
        }
    }
}

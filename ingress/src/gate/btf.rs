//! Where a field sits in a kernel struct on the running kernel, from the kernel's own BTF
//! (`/sys/kernel/btf/vmlinux`).
//!
//! ```text
//!   header ─► types (id 1, 2, …: a 12-byte head, then what the kind needs) ─► strings
//!   member_offset("tcp_request_sock", "rcv_isn"): find the struct, walk its members, through
//!   anonymous structs and unions, to the named one; its bit offset / 8
//! ```
//!
//! The TC program reads a request sock's initial sequence numbers at these offsets: they
//! differ between kernel builds, and Rust eBPF has no CO-RE relocations to fix them up. Only
//! what that needs is parsed; anything unexpected is an error, and the early reset then stays
//! off (the socket path judges every connection).

use std::path::Path;

/// Where the running kernel publishes its BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("reading {path}: {error}")]
    Read { path: String, error: String },
    #[error("not BTF, or truncated at byte {0}")]
    Malformed(usize),
    #[error("no struct {0} in the kernel's BTF")]
    NoStruct(String),
    #[error("struct {strukt} has no member {member}")]
    NoMember { strukt: String, member: String },
    #[error("{strukt}.{member} is not a byte-aligned {size}-byte integer")]
    NotInteger {
        strukt: String,
        member: String,
        size: u32,
    },
}

/// One type: its kind, name, size-or-type field, and for structs and unions, their members.
struct Type {
    kind: u32,
    name: u32,
    size_or_type: u32,
    /// (name, type, offset in bits) for struct and union members.
    members: Vec<(u32, u32, u32)>,
}

/// A parsed BTF blob.
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
}

impl Btf {
    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let bytes = std::fs::read(path).map_err(|e| BtfError::Read {
            path: path.display().to_string(),
            error: e.to_string(),
        })?;
        Btf::parse(&bytes)
    }

    pub fn parse(bytes: &[u8]) -> Result<Btf, BtfError> {
        let mut r = Reader { bytes, at: 0 };
        if r.u16()? != MAGIC {
            return Err(BtfError::Malformed(0));
        }
        let _version_flags = r.u16()?;
        let hdr_len = r.usize()?;
        let type_off = r.usize()?;
        let type_len = r.usize()?;
        let str_off = r.usize()?;
        let str_len = r.usize()?;
        let types_at = hdr_len + type_off;
        let types_end = types_at + type_len;
        let strings_at = hdr_len + str_off;
        let strings = bytes
            .get(strings_at..strings_at + str_len)
            .ok_or(BtfError::Malformed(strings_at))?
            .to_vec();
        let mut r = Reader {
            bytes: bytes
                .get(..types_end)
                .ok_or(BtfError::Malformed(types_end))?,
            at: types_at,
        };
        // Type ids start at 1; slot 0 is the void type.
        let mut types = vec![Type {
            kind: 0,
            name: 0,
            size_or_type: 0,
            members: Vec::new(),
        }];
        while r.at < types_end {
            let name = r.u32()?;
            let info = r.u32()?;
            let size_or_type = r.u32()?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            let mut members = Vec::new();
            match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => r.skip(4)?,
                KIND_ARRAY => r.skip(12)?,
                KIND_STRUCT | KIND_UNION => {
                    for _ in 0..vlen {
                        let member_name = r.u32()?;
                        let member_type = r.u32()?;
                        let offset = r.u32()?;
                        // With kind_flag the offset word also holds a bitfield size on top.
                        let bits = if kind_flag {
                            offset & 0x00ff_ffff
                        } else {
                            offset
                        };
                        members.push((member_name, member_type, bits));
                    }
                }
                KIND_ENUM | KIND_FUNC_PROTO => r.skip(8 * vlen)?,
                KIND_DATASEC | KIND_ENUM64 => r.skip(12 * vlen)?,
                _ => {}
            }
            types.push(Type {
                kind,
                name,
                size_or_type,
                members,
            });
        }
        Ok(Btf { types, strings })
    }

    /// The byte offset of `strukt.member` (found through anonymous structs and unions), which
    /// must be an integer of `size` bytes.
    pub fn member_offset(&self, strukt: &str, member: &str, size: u32) -> Result<u32, BtfError> {
        let id = self
            .types
            .iter()
            .position(|t| {
                t.kind == KIND_STRUCT && !t.members.is_empty() && self.name(t.name) == strukt
            })
            .ok_or_else(|| BtfError::NoStruct(strukt.into()))?;
        let (bits, ty) = self.find(id, member, 0).ok_or_else(|| BtfError::NoMember {
            strukt: strukt.into(),
            member: member.into(),
        })?;
        let ty = self.resolve(ty);
        let is_int = self
            .types
            .get(ty)
            .is_some_and(|t| t.kind == KIND_INT && t.size_or_type == size);
        if bits % 8 != 0 || !is_int {
            return Err(BtfError::NotInteger {
                strukt: strukt.into(),
                member: member.into(),
                size,
            });
        }
        Ok(bits / 8)
    }

    /// (bit offset, type id) of `member` in type `id`, searching anonymous members too.
    fn find(&self, id: usize, member: &str, base: u32) -> Option<(u32, usize)> {
        let ty = self.types.get(id)?;
        for &(name, member_type, offset) in &ty.members {
            let member_type = member_type as usize;
            if name == 0 {
                let inner = self.resolve(member_type);
                if matches!(self.types.get(inner)?.kind, KIND_STRUCT | KIND_UNION)
                    && let Some(found) = self.find(inner, member, base + offset)
                {
                    return Some(found);
                }
            } else if self.name(name) == member {
                return Some((base + offset, member_type));
            }
        }
        None
    }

    /// Follows typedefs and qualifiers to the type they name.
    fn resolve(&self, mut id: usize) -> usize {
        for _ in 0..32 {
            match self.types.get(id) {
                Some(t)
                    if matches!(
                        t.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.size_or_type as usize;
                }
                _ => break,
            }
        }
        id
    }

    fn name(&self, offset: u32) -> &str {
        let tail = self.strings.get(offset as usize..).unwrap_or_default();
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        std::str::from_utf8(tail.get(..end).unwrap_or_default()).unwrap_or_default()
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], BtfError> {
        let bytes = self
            .bytes
            .get(self.at..self.at + N)
            .and_then(|b| <[u8; N]>::try_from(b).ok())
            .ok_or(BtfError::Malformed(self.at))?;
        self.at += N;
        Ok(bytes)
    }

    fn u16(&mut self) -> Result<u16, BtfError> {
        self.take::<2>().map(u16::from_ne_bytes)
    }

    fn u32(&mut self) -> Result<u32, BtfError> {
        self.take::<4>().map(u32::from_ne_bytes)
    }

    fn usize(&mut self) -> Result<usize, BtfError> {
        self.u32().map(|v| v as usize)
    }

    fn skip(&mut self, n: usize) -> Result<(), BtfError> {
        if self.at + n > self.bytes.len() {
            return Err(BtfError::Malformed(self.at));
        }
        self.at += n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: `struct outer { u16 pad; union { u32 a; }; u32 b; }` with `b` behind a
    /// typedef, and a 2-byte `c`.
    fn sample() -> Vec<u8> {
        let strings = b"\0u32\0u16\0outer\0a\0b\0c\0pad\0u32_t\0".to_vec();
        let name = |s: &str| -> u32 {
            let needle = format!("\0{s}\0");
            let at = strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap();
            u32::try_from(at + 1).unwrap()
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for w in words {
                types.extend_from_slice(&w.to_ne_bytes());
            }
        };
        // 1: u32
        push(&[name("u32"), KIND_INT << 24, 4, 32]);
        // 2: u16
        push(&[name("u16"), KIND_INT << 24, 2, 16]);
        // 3: union { u32 a; }
        push(&[0, (KIND_UNION << 24) | 1, 4, name("a"), 1, 0]);
        // 4: typedef u32_t = u32
        push(&[name("u32_t"), KIND_TYPEDEF << 24, 1]);
        // 5: struct outer { u16 pad @0; union @32; u32_t b @64; u16 c @96 }
        push(&[
            name("outer"),
            (KIND_STRUCT << 24) | 4,
            14,
            name("pad"),
            2,
            0,
            0,
            3,
            32,
            name("b"),
            4,
            64,
            name("c"),
            2,
            96,
        ]);
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_ne_bytes());
        out.extend_from_slice(&[1, 0]);
        let len = |v: &Vec<u8>| u32::try_from(v.len()).unwrap();
        for w in [24u32, 0, len(&types), len(&types), len(&strings)] {
            out.extend_from_slice(&w.to_ne_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(&strings);
        out
    }

    #[test]
    fn finds_members_through_anonymous_unions_and_typedefs() {
        let btf = Btf::parse(&sample()).unwrap();
        let cases: [(&str, &str, u32, Result<u32, BtfError>); 6] = [
            ("outer", "a", 4, Ok(4)),
            ("outer", "b", 4, Ok(8)),
            ("outer", "c", 2, Ok(12)),
            (
                "outer",
                "c",
                4,
                Err(BtfError::NotInteger {
                    strukt: "outer".into(),
                    member: "c".into(),
                    size: 4,
                }),
            ),
            (
                "outer",
                "nope",
                4,
                Err(BtfError::NoMember {
                    strukt: "outer".into(),
                    member: "nope".into(),
                }),
            ),
            ("inner", "a", 4, Err(BtfError::NoStruct("inner".into()))),
        ];
        for (strukt, member, size, want) in cases {
            assert_eq!(
                btf.member_offset(strukt, member, size),
                want,
                "{strukt}.{member}"
            );
        }
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let bytes = sample();
        for len in [0, 3, 10, 30, bytes.len() - 1] {
            assert!(Btf::parse(&bytes[..len]).is_err(), "{len} bytes");
        }
    }

    #[test]
    fn the_running_kernel_has_the_request_sock_fields() {
        let path = Path::new(VMLINUX);
        if !path.exists() {
            return;
        }
        let btf = Btf::from_file(path).unwrap();
        let rcv = btf.member_offset("tcp_request_sock", "rcv_isn", 4).unwrap();
        let snt = btf.member_offset("tcp_request_sock", "snt_isn", 4).unwrap();
        assert_ne!(rcv, snt);
        assert!(rcv > 0 && snt > 0);
    }
}

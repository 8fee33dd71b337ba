//! Makes `bpftool map dump` print host names as strings.
//!
//! bpftool prints a BTF array as a string only if its element is a 1-byte INT named `char` or
//! with the CHAR encoding (btf_dumper.c, `is_str_array`). Rust has no such type: `[u8; N]`
//! becomes an array of INT `u8`, printed as a list of numbers. So after linking we give each
//! named field (`HostKey.name`, `GateEvent.name`) its own array type whose element is a new
//! INT `char` (1 byte, CHAR encoding). Only those fields change; every other `u8` stays a
//! number, so an address in an array is never mistaken for text.
//!
//! ```text
//!   .BTF: header | types ... | strings ...
//!   after: header | types ... + INT "char" + ARRAY(char, n) per field | strings ... + "char\0"
//!   ELF:  the new .BTF is appended to the file and its section header repointed; nothing
//!         else in the object moves, so relocations against .BTF type offsets stay valid.
//! ```

use anyhow::{Context, Result, bail, ensure};

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN_U32: u32 = 24;
const HEADER_LEN: usize = HEADER_LEN_U32 as usize;
const TYPE_LEN: usize = 12;

const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const INT_CHAR: u32 = 1 << 1;

/// The struct fields that hold names: (struct, field).
pub const NAME_FIELDS: [(&str, &str); 2] = [("HostKey", "name"), ("GateEvent", "name")];

/// Rewrites the `.BTF` section of an ELF object so every field in `fields` is a `char` array.
pub fn mark_name_fields(elf: &[u8], fields: &[(&str, &str)]) -> Result<Vec<u8>> {
    let section = find_section(elf, ".BTF")?;
    let btf = elf
        .get(section.offset..section.offset + section.size)
        .context(".BTF section lies outside the file")?;
    let new_btf = char_arrays(btf, fields)?;
    replace_section(elf, &section, &new_btf)
}

/// The BTF half of [`mark_name_fields`].
pub fn char_arrays(btf: &[u8], fields: &[(&str, &str)]) -> Result<Vec<u8>> {
    let parsed = Btf::parse(btf)?;
    let mut extra_types = Vec::new();
    let mut extra_strings = b"char\0".to_vec();
    let char_name = parsed.str_len;
    let char_id = parsed.type_count + 1;
    // INT "char": 1 byte, 8 bits at offset 0, CHAR encoding.
    push_type(&mut extra_types, char_name, KIND_INT << 24, 1);
    extra_types.extend_from_slice(&((INT_CHAR << 24) | 8).to_le_bytes());
    let mut next_id = char_id + 1;

    let mut out_types = parsed.types_bytes().to_vec();
    for &(struct_name, field_name) in fields {
        let mut found = 0;
        for member in parsed.members_named(struct_name, field_name)? {
            let array = parsed.array(member.type_id).with_context(|| {
                format!("{struct_name}.{field_name} is not an array in the object's BTF")
            })?;
            let elem = parsed.int(array.elem).with_context(|| {
                format!("{struct_name}.{field_name} is not an array of integers")
            })?;
            ensure!(
                elem.size == 1,
                "{struct_name}.{field_name} elements are not 1-byte integers"
            );
            push_type(&mut extra_types, 0, KIND_ARRAY << 24, 0);
            for v in [char_id, array.index, array.nelems] {
                extra_types.extend_from_slice(&v.to_le_bytes());
            }
            let at = member.type_field_at;
            out_types
                .get_mut(at..at + 4)
                .context("member offset outside the type section")?
                .copy_from_slice(&next_id.to_le_bytes());
            next_id += 1;
            found += 1;
        }
        ensure!(
            found > 0,
            "no struct {struct_name} with a field {field_name} in the object's BTF"
        );
    }
    out_types.extend_from_slice(&extra_types);
    let mut out_strings = parsed.strings_bytes().to_vec();
    out_strings.append(&mut extra_strings);

    let mut out = Vec::with_capacity(HEADER_LEN + out_types.len() + out_strings.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(parsed.version);
    out.push(parsed.flags);
    let type_len = u32::try_from(out_types.len())?;
    let str_len = u32::try_from(out_strings.len())?;
    for v in [HEADER_LEN_U32, 0, type_len, type_len, str_len] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&out_types);
    out.extend_from_slice(&out_strings);
    Ok(out)
}

fn push_type(out: &mut Vec<u8>, name_off: u32, info: u32, size_or_type: u32) {
    for v in [name_off, info, size_or_type] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// A little-endian BTF blob, indexed just enough to find struct members.
struct Btf<'a> {
    version: u8,
    flags: u8,
    types: &'a [u8],
    strings: &'a [u8],
    str_len: u32,
    /// Byte offset of each type in `types`; type id n is at index n - 1.
    offsets: Vec<usize>,
    type_count: u32,
}

struct Member {
    type_id: u32,
    /// Where the member's type id sits in the type section.
    type_field_at: usize,
}

struct Array {
    elem: u32,
    index: u32,
    nelems: u32,
}

struct Int {
    size: u32,
}

impl<'a> Btf<'a> {
    fn parse(data: &'a [u8]) -> Result<Btf<'a>> {
        ensure!(data.len() >= HEADER_LEN, "BTF shorter than its header");
        ensure!(
            u16_at(data, 0)? == MAGIC,
            "not little-endian BTF (bad magic)"
        );
        let hdr_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let body = data
            .get(hdr_len..)
            .context("BTF header length past the end")?;
        let types = body
            .get(type_off..type_off + type_len)
            .context("BTF type section past the end")?;
        let strings = body
            .get(str_off..str_off + str_len)
            .context("BTF string section past the end")?;
        let mut offsets = Vec::new();
        let mut at = 0;
        while at < types.len() {
            offsets.push(at);
            at += TYPE_LEN + extra_len(types, at)?;
        }
        ensure!(at == types.len(), "BTF type section ends inside a type");
        Ok(Btf {
            version: data.get(2).copied().unwrap_or(1),
            flags: data.get(3).copied().unwrap_or(0),
            types,
            strings,
            str_len: u32::try_from(str_len)?,
            type_count: u32::try_from(offsets.len())?,
            offsets,
        })
    }

    fn types_bytes(&self) -> &[u8] {
        self.types
    }

    fn strings_bytes(&self) -> &[u8] {
        self.strings
    }

    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(rest.get(..end).unwrap_or_default()).unwrap_or_default()
    }

    fn at(&self, id: u32) -> Option<usize> {
        self.offsets.get((id as usize).checked_sub(1)?).copied()
    }

    fn kind(&self, at: usize) -> Result<u32> {
        Ok((u32_at(self.types, at + 4)? >> 24) & 0x1f)
    }

    fn members_named(&self, struct_name: &str, field: &str) -> Result<Vec<Member>> {
        let mut found = Vec::new();
        for &at in &self.offsets {
            let info = u32_at(self.types, at + 4)?;
            if (info >> 24) & 0x1f != KIND_STRUCT
                || self.name(u32_at(self.types, at)?) != struct_name
            {
                continue;
            }
            for i in 0..(info & 0xffff) as usize {
                let m = at + TYPE_LEN + i * 12;
                if self.name(u32_at(self.types, m)?) == field {
                    found.push(Member {
                        type_id: u32_at(self.types, m + 4)?,
                        type_field_at: m + 4,
                    });
                }
            }
        }
        Ok(found)
    }

    fn array(&self, id: u32) -> Option<Array> {
        let at = self.at(id)?;
        if self.kind(at).ok()? != KIND_ARRAY {
            return None;
        }
        let field = |n| u32_at(self.types, at + TYPE_LEN + n).ok();
        Some(Array {
            elem: field(0)?,
            index: field(4)?,
            nelems: field(8)?,
        })
    }

    fn int(&self, id: u32) -> Option<Int> {
        let at = self.at(id)?;
        if self.kind(at).ok()? != KIND_INT {
            return None;
        }
        Some(Int {
            size: u32_at(self.types, at + 8).ok()?,
        })
    }
}

/// Bytes following the common 12-byte header of the type at `at`, by kind.
fn extra_len(types: &[u8], at: usize) -> Result<usize> {
    let info = u32_at(types, at + 4)?;
    let vlen = (info & 0xffff) as usize;
    Ok(match (info >> 24) & 0x1f {
        1 => 4,                    // INT
        3 => 12,                   // ARRAY
        4 | 5 => 12 * vlen,        // STRUCT, UNION
        6 => 8 * vlen,             // ENUM
        13 => 8 * vlen,            // FUNC_PROTO
        14 => 4,                   // VAR
        15 => 12 * vlen,           // DATASEC
        17 => 4,                   // DECL_TAG
        19 => 12 * vlen,           // ENUM64
        2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
        kind => bail!("unknown BTF kind {kind} at type offset {at}"),
    })
}

/// One ELF64 little-endian section: where its header and data are.
struct Section {
    header_at: usize,
    offset: usize,
    size: usize,
}

const SH_OFFSET: usize = 24;
const SH_SIZE: usize = 32;

fn find_section(elf: &[u8], name: &str) -> Result<Section> {
    ensure!(
        elf.get(..4) == Some(b"\x7fELF".as_slice()),
        "not an ELF file"
    );
    ensure!(
        elf.get(4) == Some(&2) && elf.get(5) == Some(&1),
        "not a 64-bit little-endian ELF"
    );
    let shoff = usize_at(elf, 0x28)?;
    let shentsize = usize::from(u16_at(elf, 0x3a)?);
    let shnum = usize::from(u16_at(elf, 0x3c)?);
    let shstrndx = usize::from(u16_at(elf, 0x3e)?);
    let header = |i: usize| shoff + i * shentsize;
    let names_at = usize_at(elf, header(shstrndx) + SH_OFFSET)?;
    for i in 0..shnum {
        let h = header(i);
        let name_off = u32_at(elf, h)? as usize;
        let rest = elf
            .get(names_at + name_off..)
            .context("section name outside the file")?;
        if rest.split(|&b| b == 0).next() == Some(name.as_bytes()) {
            return Ok(Section {
                header_at: h,
                offset: usize_at(elf, h + SH_OFFSET)?,
                size: usize_at(elf, h + SH_SIZE)?,
            });
        }
    }
    bail!("no {name} section (was the object linked with --btf?)")
}

/// Appends `data` to the file, 8-byte aligned, and points the section's header at it.
fn replace_section(elf: &[u8], section: &Section, data: &[u8]) -> Result<Vec<u8>> {
    let mut out = elf.to_vec();
    out.resize(out.len().next_multiple_of(8), 0);
    let offset = out.len() as u64;
    out.extend_from_slice(data);
    let h = section.header_at;
    out.get_mut(h + SH_OFFSET..h + SH_OFFSET + 8)
        .context("section header outside the file")?
        .copy_from_slice(&offset.to_le_bytes());
    out.get_mut(h + SH_SIZE..h + SH_SIZE + 8)
        .context("section header outside the file")?
        .copy_from_slice(&(data.len() as u64).to_le_bytes());
    Ok(out)
}

fn u16_at(b: &[u8], at: usize) -> Result<u16> {
    let bytes = b.get(at..at + 2).context("read past the end")?;
    Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    let bytes: [u8; 4] = b.get(at..at + 4).context("read past the end")?.try_into()?;
    Ok(u32::from_le_bytes(bytes))
}

/// A 64-bit ELF offset or size.
fn usize_at(b: &[u8], at: usize) -> Result<usize> {
    let bytes: [u8; 8] = b.get(at..at + 8).context("read past the end")?.try_into()?;
    Ok(usize::try_from(u64::from_le_bytes(bytes))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with `u8`, an index int, `[u8; 4]`, `[u8; 2]` and
    /// `struct HostKey { name: [u8; 4], other: [u8; 2] }`.
    fn sample_btf() -> Vec<u8> {
        let strings = b"\0u8\0idx\0HostKey\0name\0other\0".to_vec();
        let (u8_name, idx_name, key_name, name_name, other_name) = (1u32, 4u32, 8u32, 16u32, 21u32);
        let mut types = Vec::new();
        push_type(&mut types, u8_name, KIND_INT << 24, 1); // 1: u8
        types.extend_from_slice(&8u32.to_le_bytes());
        push_type(&mut types, idx_name, KIND_INT << 24, 4); // 2: idx
        types.extend_from_slice(&32u32.to_le_bytes());
        push_type(&mut types, 0, KIND_ARRAY << 24, 0); // 3: [u8; 4]
        for v in [1u32, 2, 4] {
            types.extend_from_slice(&v.to_le_bytes());
        }
        push_type(&mut types, 0, KIND_ARRAY << 24, 0); // 4: [u8; 2]
        for v in [1u32, 2, 2] {
            types.extend_from_slice(&v.to_le_bytes());
        }
        push_type(&mut types, key_name, (KIND_STRUCT << 24) | 2, 6); // 5: HostKey
        for v in [name_name, 3, 0, other_name, 4, 32] {
            types.extend_from_slice(&v.to_le_bytes());
        }
        let mut btf = MAGIC.to_le_bytes().to_vec();
        btf.extend_from_slice(&[1, 0]);
        let (tl, sl) = (
            u32::try_from(types.len()).unwrap(),
            u32::try_from(strings.len()).unwrap(),
        );
        for v in [HEADER_LEN_U32, 0, tl, tl, sl] {
            btf.extend_from_slice(&v.to_le_bytes());
        }
        btf.extend_from_slice(&types);
        btf.extend_from_slice(&strings);
        btf
    }

    #[test]
    fn only_the_named_field_becomes_a_char_array() {
        let out = char_arrays(&sample_btf(), &[("HostKey", "name")]).unwrap();
        let btf = Btf::parse(&out).unwrap();
        let name = &btf.members_named("HostKey", "name").unwrap()[0];
        let array = btf.array(name.type_id).expect("name is still an array");
        assert_eq!(array.nelems, 4);
        let elem_at = btf.at(array.elem).unwrap();
        assert_eq!(btf.name(u32_at(btf.types, elem_at).unwrap()), "char");
        let encoding = u32_at(btf.types, elem_at + TYPE_LEN).unwrap() >> 24;
        assert_eq!(encoding, INT_CHAR);
        assert_eq!(btf.int(array.elem).unwrap().size, 1);

        let other = &btf.members_named("HostKey", "other").unwrap()[0];
        assert_eq!(other.type_id, 4, "other fields keep their type");
        assert_eq!(
            btf.array(4).unwrap().elem,
            1,
            "the shared u8 array is untouched"
        );
        let u8_at = btf.at(1).unwrap();
        assert_eq!(btf.name(u32_at(btf.types, u8_at).unwrap()), "u8");
        assert_eq!(
            u32_at(btf.types, u8_at + TYPE_LEN).unwrap() >> 24,
            0,
            "u8 stays a number"
        );
    }

    #[test]
    fn the_kernel_loader_accepts_the_result() {
        let out = char_arrays(&sample_btf(), &[("HostKey", "name")]).unwrap();
        let btf = aya_obj::btf::Btf::parse(&out, object::Endianness::Little).unwrap();
        let id = btf
            .id_by_type_name_kind("char", aya_obj::btf::BtfKind::Int)
            .unwrap();
        assert_eq!(id, 6);
    }

    #[test]
    fn a_missing_or_mistyped_field_is_an_error() {
        let cases: [(&str, &str, &str); 3] = [
            ("Missing", "name", "no struct Missing"),
            (
                "HostKey",
                "missing",
                "no struct HostKey with a field missing",
            ),
            ("HostKey", "name", ""),
        ];
        for (s, f, want) in cases {
            let got = char_arrays(&sample_btf(), &[(s, f)]);
            match want {
                "" => assert!(got.is_ok(), "{s}.{f}: {got:?}", got = got.err()),
                want => assert!(
                    format!("{:#}", got.as_ref().err().unwrap()).contains(want),
                    "{s}.{f}: {:?}",
                    got.err()
                ),
            }
        }
        let mut truncated = sample_btf();
        truncated.truncate(40);
        assert!(char_arrays(&truncated, &[("HostKey", "name")]).is_err());
    }

    #[test]
    fn the_section_moves_and_everything_else_stays() {
        use object::{Object, ObjectSection};
        let mut obj = object::write::Object::new(
            object::BinaryFormat::Elf,
            object::Architecture::Bpf,
            object::Endianness::Little,
        );
        let text = obj.add_section(vec![], b".text".to_vec(), object::SectionKind::Text);
        obj.append_section_data(text, &[0x95, 0, 0, 0, 0, 0, 0, 0], 8);
        let btf = obj.add_section(vec![], b".BTF".to_vec(), object::SectionKind::Other);
        obj.append_section_data(btf, &sample_btf(), 4);
        let elf = obj.write().unwrap();

        let out = mark_name_fields(&elf, &[("HostKey", "name")]).unwrap();
        let h = find_section(&elf, ".BTF").unwrap().header_at;
        let repointed = h + SH_OFFSET..h + SH_SIZE + 8;
        for (i, (a, b)) in elf.iter().zip(&out).enumerate() {
            assert!(
                a == b || repointed.contains(&i),
                "byte {i} changed outside the .BTF header"
            );
        }
        let file = object::File::parse(&*out).unwrap();
        let new_btf = file.section_by_name(".BTF").unwrap().data().unwrap();
        assert_eq!(
            new_btf,
            char_arrays(&sample_btf(), &[("HostKey", "name")]).unwrap()
        );
        let text = file.section_by_name(".text").unwrap().data().unwrap();
        assert_eq!(text, [0x95, 0, 0, 0, 0, 0, 0, 0]);
    }
}

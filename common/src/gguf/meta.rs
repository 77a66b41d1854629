//! GGUF metadata values.

/// One metadata value, as stored (GGUF value types 0..=12).
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Elements all of one type (possibly arrays themselves).
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The GGUF type name: `uint8`, `int8`, ..., `string`, `array`, `float64`.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "uint8",
            MetaValue::I8(_) => "int8",
            MetaValue::U16(_) => "uint16",
            MetaValue::I16(_) => "int16",
            MetaValue::U32(_) => "uint32",
            MetaValue::I32(_) => "int32",
            MetaValue::F32(_) => "float32",
            MetaValue::Bool(_) => "bool",
            MetaValue::Str(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "uint64",
            MetaValue::I64(_) => "int64",
            MetaValue::F64(_) => "float64",
        }
    }

    /// An integer of any width as i128 (every GGUF integer fits).
    fn int(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer of any width that is `>= 0`, as u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.int().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer of any width that fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.int().and_then(|v| i64::try_from(v).ok())
    }

    /// A float (f32 widened exactly), or an integer that f64 holds exactly
    /// (`|v| <= 2^53`).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.int().filter(|v| v.unsigned_abs() <= 1 << 53).map(|v| v as f64),
        }
    }

    /// A bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An array's elements.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_accessors_convert_only_losslessly() {
        assert_eq!(MetaValue::U8(200).as_i64(), Some(200));
        assert_eq!(MetaValue::I8(-1).as_u64(), None);
        assert_eq!(MetaValue::I32(7).as_u64(), Some(7));
        assert_eq!(MetaValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(MetaValue::U64(u64::MAX).as_u64(), Some(u64::MAX));
        assert_eq!(MetaValue::I64(i64::MIN).as_i64(), Some(i64::MIN));
        assert_eq!(MetaValue::U32(3).as_f64(), Some(3.0));
        assert_eq!(MetaValue::U64((1 << 53) + 1).as_f64(), None);
        assert_eq!(MetaValue::F32(0.1).as_f64(), Some(0.1f32 as f64));
        assert_eq!(MetaValue::F64(0.5).as_u64(), None);
        assert_eq!(MetaValue::Bool(true).as_u64(), None);
        assert_eq!(MetaValue::Bool(true).as_bool(), Some(true));
        assert_eq!(MetaValue::Str("x".into()).as_str(), Some("x"));
        assert_eq!(MetaValue::Str("x".into()).as_array(), None);
        let a = MetaValue::Array(vec![MetaValue::U8(1)]);
        assert_eq!(a.as_array(), Some(&[MetaValue::U8(1)][..]));
        assert_eq!(a.type_name(), "array");
    }
}

//! Lists a template changes in place inside a `namespace`, as Python's do.
//!
//! minijinja's values are immutable, so `ns.ids.append(x)` fails there
//! ("sequence has no method named append"). Kimi K2's templates keep a
//! queue of call ids that way:
//!
//! ```jinja
//! {%- set tool_response_queue = namespace(ids=[]) -%}
//! {%- set _ = tool_response_queue.ids.append(formatted_id) -%}
//! {%- set tool_call_id = tool_response_queue.ids.pop(0) -%}
//! ```
//!
//! charm's `namespace()` is minijinja's with every list among its initial
//! values made a [`NamespaceList`], which takes Python's `append`,
//! `extend`, `insert` and `pop` and otherwise reads as a list (indexing,
//! iteration, `length`, truthiness, `tojson`).

use std::sync::{Arc, Mutex};

use minijinja::value::{Enumerator, Object, ObjectRepr, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

/// A list a template may change in place.
#[derive(Debug, Default)]
pub struct NamespaceList(Mutex<Vec<Value>>);

impl NamespaceList {
    fn items(&self) -> std::sync::MutexGuard<'_, Vec<Value>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `i` as Python indexes a list of `len` (negative from the end).
fn index(i: i64, len: usize) -> Option<usize> {
    let i = if i < 0 { i + len as i64 } else { i };
    (0..len as i64).contains(&i).then_some(i as usize)
}

fn bad(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

impl Object for NamespaceList {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let items = self.items();
        let i = index(key.as_i64()?, items.len())?;
        Some(items[i].clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.items().clone())
    }

    fn call_method(self: &Arc<Self>, _: &State<'_, '_>, method: &str, args: &[Value]) -> Result<Value, Error> {
        let mut items = self.items();
        match (method, args) {
            // list.append(x)
            ("append", [x]) => items.push(x.clone()),
            // list.extend(xs)
            ("extend", [xs]) => items.extend(xs.try_iter()?),
            // list.insert(i, x): clamped to the list, as Python does.
            ("insert", [i, x]) => {
                let len = items.len() as i64;
                let i = i.as_i64().ok_or_else(|| bad("insert: the index is not an integer"))?;
                let at = if i < 0 { (i + len).max(0) } else { i.min(len) };
                items.insert(at as usize, x.clone());
            }
            // list.pop([i])
            ("pop", [] | [_]) => {
                let i = match args.first() {
                    Some(i) => i.as_i64().ok_or_else(|| bad("pop: the index is not an integer"))?,
                    None => -1,
                };
                let at = index(i, items.len()).ok_or_else(|| bad("pop index out of range"))?;
                return Ok(items.remove(at));
            }
            _ => return Err(Error::from(ErrorKind::UnknownMethod)),
        }
        // Python's list methods that change the list return None.
        Ok(Value::from(()))
    }
}

/// `value` with each list made a [`NamespaceList`] (`value` is a map: a
/// namespace's initial values).
fn with_namespace_lists(value: Value) -> Result<Value, Error> {
    if value.kind() != ValueKind::Map {
        return Ok(value);
    }
    let mut pairs = Vec::new();
    for key in value.try_iter()? {
        let v = value.get_item(&key)?;
        let v = if v.kind() == ValueKind::Seq {
            Value::from_object(NamespaceList(Mutex::new(v.try_iter()?.collect())))
        } else {
            v
        };
        pairs.push((key, v));
    }
    Ok(Value::from_iter(pairs))
}

/// `namespace(...)`: minijinja's, its initial lists changeable in place.
pub fn namespace(defaults: Option<Value>) -> Result<Value, Error> {
    minijinja::functions::namespace(defaults.map(with_namespace_lists).transpose()?)
}

#[cfg(test)]
mod tests {
    use minijinja::Environment;

    fn render(src: &str) -> String {
        let mut env = Environment::new();
        env.add_function("namespace", super::namespace);
        env.render_str(src, ()).unwrap_or_else(|e| format!("error: {e}"))
    }

    #[test]
    fn namespace_lists_change_in_place_as_python_lists() {
        let out = render(
            "{%- set q = namespace(ids=[], n=0, tag='x') -%}\
             {%- for i in range(3) %}{% set _ = q.ids.append('id' ~ i) %}{% endfor -%}\
             {{ q.ids | length }} {{ q.ids[0] }} {{ q.ids[-1] }} {{ q.ids | tojson }} {{ q.tag }}|\
             {{- q.ids.pop(0) }} {{ q.ids.pop() }} {{ q.ids | join(',') }}|\
             {%- set _ = q.ids.insert(0, 'a') %}{% set _ = q.ids.extend(['b', 'c']) %}{{ q.ids | join(',') }}|\
             {%- if q.ids %}full{% endif %}{% set _ = q.ids.pop() %}{% set _ = q.ids.pop() %}\
             {%- set _ = q.ids.pop() %}{% set _ = q.ids.pop() %}{% if not q.ids %} empty{% endif %}",
        );
        assert_eq!(
            out,
            "3 id0 id2 [\"id0\",\"id1\",\"id2\"] x|id0 id2 id1|a,id1,b,c|full empty"
        );
    }

    #[test]
    fn bad_list_calls_are_template_errors() {
        for src in [
            "{% set q = namespace(ids=[]) %}{{ q.ids.pop() }}",
            "{% set q = namespace(ids=[1]) %}{{ q.ids.pop(5) }}",
            "{% set q = namespace(ids=[1]) %}{{ q.ids.sort() }}",
        ] {
            assert!(render(src).starts_with("error:"), "{src}: {}", render(src));
        }
    }
}

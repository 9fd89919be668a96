//! A tower `Layer` that guards routes with dlock distributed locks.

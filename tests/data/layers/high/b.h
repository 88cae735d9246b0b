// A higher layer's header with no includes.
#pragma once

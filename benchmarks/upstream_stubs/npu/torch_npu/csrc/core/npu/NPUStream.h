// kvpd stand-in: empty; the planner .cpp needs nothing from it on the CPU.
#pragma once

#!/bin/bash
rm -f *.tmp
